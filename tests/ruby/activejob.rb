# Drives real Rails ActiveJob (Debian's ruby-activejob) with the Sidekiq
# adapter against REDIS_URL, for the ActiveJob tests: enqueues jobs with
# perform_later as a Rails app does, and prints what the Sidekiq API reads
# back, as one JSON document on stdout.
#
#   ruby activejob.rb enqueue    (AjRecordJob with every kind of argument)
#   ruby activejob.rb bigint     (AjRecordJob with an integer past 64 bits)
#   ruby activejob.rb schedule SECONDS  (AjRecordJob.set(wait: SECONDS))
#   ruby activejob.rb record KEY (RecordJob, a class the examples' handler
#                                 reads its key from: its first argument)
#   ruby activejob.rb fail       (FailingAjJob)
#   ruby activejob.rb retries    (RetrySet as the Web UI shows it)
# Each enqueue prints the Sidekiq jid (provider_job_id).
require 'json'
require 'sidekiq'
require 'sidekiq/api'
require 'active_job'
require 'active_job/queue_adapters/sidekiq_adapter'
require 'globalid'

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
Sidekiq.logger.level = Logger::WARN
ActiveJob::Base.queue_adapter = :sidekiq
ActiveJob::Base.logger = Logger.new(nil)
GlobalID.app = 'app'

# A model as GlobalID finds it: gid://app/Model/ID.
class Model
  include GlobalID::Identification
  attr_reader :id

  def initialize(id)
    @id = id
  end

  def self.find(id)
    new(id)
  end
end

# Their handlers are C (examples/jobs.c); Ruby only enqueues them.
class AjRecordJob < ActiveJob::Base
  def perform(*args, **kw); end
end

class FailingAjJob < ActiveJob::Base
  def perform(*args); end
end

# The examples' RecordJob, as a Rails app would declare it: perform(key).
class RecordJob < ActiveJob::Base
  def perform(key); end
end

def jid(job)
  job.provider_job_id or abort('not enqueued')
end

cmd = ARGV.shift
out =
  case cmd
  when 'enqueue'
    jid(AjRecordJob.perform_later(
          :sym, { a: 1, 'b' => :c }, [1, 2], 'str', 1.5, nil, true, Model.new(7),
          ActiveSupport::HashWithIndifferentAccess.new('x' => 1),
          Time.utc(2026, 1, 2, 3, 4, 5), 3.days, kw: :v))
  when 'bigint' then jid(AjRecordJob.perform_later(12_345_678_901_234_567_890, 'str'))
  when 'schedule' then jid(AjRecordJob.set(wait: ARGV[0].to_f).perform_later('later'))
  when 'record' then jid(RecordJob.perform_later(ARGV[0]))
  when 'fail' then jid(FailingAjJob.perform_later(:x, 1))
  when 'retries'
    Sidekiq::RetrySet.new.map do |e|
      { 'display_class' => e.display_class, 'display_args' => e.display_args,
        'error_class' => e['error_class'], 'error_message' => e['error_message'],
        'retry_count' => e['retry_count'], 'item' => e.item, 'value' => e.value }
    end
  else abort("unknown command #{cmd}")
  end
puts JSON.generate(out)
