# Drives real Ruby Sidekiq against REDIS_URL for the interop tests: pushes
# jobs with Sidekiq::Client and prints what the Sidekiq API reads back, as
# one JSON document on stdout. Debian's 6.4.1 by default; 7.3, 8.0 and 8.1 when
# the tests run it after tests/ruby/sidekiq_version.rb (kt_ruby_v), with
# one output format for all four.
#
#   ruby sidekiq.rb push '{"class":"RecordJob","args":["k"]}'
#   ruby sidekiq.rb push_bulk '{"class":"RecordJob","args":[["k"],["k"]]}'
#   ruby sidekiq.rb push_raw '{"class":"FailJob","args":[]}'  (LPUSH as is, plus jid and
#       timestamps in the unit of the version's client: a payload without
#       "retry", as another client may write)
#   ruby sidekiq.rb push_in SECONDS '{"class":"RecordJob","args":["k"]}'  (as perform_in)
#   ruby sidekiq.rb perform_async CLASS '{"unique_for":600}' '["k"]' ...  (a job class
#       with those sidekiq_options, a perform_async per args; prints the jids)
#   ruby sidekiq.rb stats | processes | workers | retries | dead | scheduled
#   ruby sidekiq.rb quiet IDENTITY | stop IDENTITY
require 'json'
require 'sidekiq'
require 'sidekiq/api'

# Sidekiq 7+ speaks redis-client: no Redis constant to configure.
Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
Sidekiq.logger.level = Logger::WARN

SIDEKIQ8 = Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new('8.0')

# Now as the version's own client writes created_at/enqueued_at: float
# seconds up to 7.x, integer milliseconds from 8.0.
def client_now
  SIDEKIQ8 ? (Time.now.to_f * 1000).to_i : Time.now.to_f
end

TIMES = %w[created_at enqueued_at failed_at retried_at].freeze

# The timestamps of an entry in seconds, as the version reads them: 8.0's
# JobRecord turns an Integer into milliseconds and a Float into seconds;
# older ones (and their Web UI) take the number as seconds.
def seconds(e)
  TIMES.each_with_object({}) do |k, h|
    next if e[k].nil?

    h[k] = SIDEKIQ8 ? e.public_send(k).to_f : Time.at(e[k]).to_f
  end
end

def entries(set)
  set.map do |e|
    { 'score' => e.score, 'item' => e.item, 'error_backtrace' => e.error_backtrace,
      'seconds' => seconds(e), 'display_class' => e.display_class,
      'error' => "#{e['error_class']}: #{e['error_message']}" }
  end
end

# WorkSet yields a Hash with the payload parsed up to 6.x, a Sidekiq::Work
# from 7.0 (its payload the job's JSON string, its job a JobRecord).
def works
  Sidekiq::WorkSet.new.map do |pid, tid, work|
    if work.is_a?(Hash)
      raw = work
      job = Sidekiq::JobRecord.new(work['payload'])
    else
      raw = work.instance_variable_get(:@hsh)
      job = work.job
    end
    { 'process' => pid, 'thread' => tid,
      'work' => { 'queue' => raw['queue'], 'run_at' => raw['run_at'], 'payload' => job.item },
      'klass' => job.display_class, 'jid' => job.jid }
  end
end

def find_process(identity)
  Sidekiq::ProcessSet.new.find { |p| p['identity'] == identity } or abort("no process #{identity}")
end

cmd = ARGV.shift
out =
  case cmd
  when 'push' then Sidekiq::Client.push(JSON.parse(ARGV[0]))
  when 'push_raw'
    job = JSON.parse(ARGV[0])
    job['jid'] ||= SecureRandom.hex(12)
    job['created_at'] = job['enqueued_at'] = client_now
    q = job['queue'] ||= 'default'
    Sidekiq.redis { |c| c.sadd('queues', q); c.lpush("queue:#{q}", JSON.generate(job)) }
    job['jid']
  when 'push_bulk' then Sidekiq::Client.push_bulk(JSON.parse(ARGV[0]))
  when 'perform_async'
    name, opts = ARGV.shift, JSON.parse(ARGV.shift)
    # As an app writes it: `unique_until: :start` is a Symbol there.
    opts = opts.to_h { |k, v| [k.to_sym, k == 'unique_until' ? v.to_sym : v] }
    klass = Object.const_set(name, Class.new { include Sidekiq::Job })
    klass.sidekiq_options(**opts)
    ARGV.map { |a| klass.perform_async(*JSON.parse(a)) }
  when 'push_in' then Sidekiq::Client.push(JSON.parse(ARGV[1]).merge('at' => Time.now.to_f + ARGV[0].to_f))
  when 'stats'
    s = Sidekiq::Stats.new
    { 'processed' => s.processed, 'failed' => s.failed, 'enqueued' => s.enqueued,
      'scheduled_size' => s.scheduled_size, 'retry_size' => s.retry_size,
      'dead_size' => s.dead_size, 'processes_size' => s.processes_size,
      'workers_size' => s.workers_size, 'queues' => s.queues,
      'history_processed' => Sidekiq::Stats::History.new(1).processed.values.first,
      'history_failed' => Sidekiq::Stats::History.new(1).failed.values.first }
  # The process info as written, and what the version's Process reads of
  # its queues (8.0.9+ from "capsules", as the Busy page's Queues line).
  when 'processes'
    Sidekiq::ProcessSet.new.map do |p|
      p.instance_variable_get(:@attribs).merge('api_queues' => p.queues,
                                              'api_weights' => p.respond_to?(:weights) ? p.weights : nil)
    end
  when 'workers' then works
  when 'retries' then entries(Sidekiq::RetrySet.new)
  when 'dead' then entries(Sidekiq::DeadSet.new)
  when 'scheduled' then entries(Sidekiq::ScheduledSet.new)
  when 'queue_latency' then Sidekiq::Queue.new(ARGV[0] || 'default').latency
  when 'quiet' then find_process(ARGV[0]).quiet!; 'ok'
  when 'stop' then find_process(ARGV[0]).stop!; 'ok'
  else abort("unknown command #{cmd}")
  end
puts JSON.generate(out)
