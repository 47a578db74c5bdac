# Drives real Ruby Sidekiq (Debian's ruby-sidekiq) against REDIS_URL for the
# interop tests: pushes jobs with Sidekiq::Client and prints what the
# Sidekiq API reads back, as one JSON document on stdout.
#
#   ruby sidekiq.rb push '{"class":"RecordJob","args":["k"]}'
#   ruby sidekiq.rb push_bulk '{"class":"RecordJob","args":[["k"],["k"]]}'
#   ruby sidekiq.rb push_raw '{"class":"FailJob","args":[]}'  (LPUSH as is, plus jid and
#       timestamps: a payload without "retry", as another client may write)
#   ruby sidekiq.rb push_in SECONDS '{"class":"RecordJob","args":["k"]}'  (as perform_in)
#   ruby sidekiq.rb stats | processes | workers | retries | dead | scheduled
#   ruby sidekiq.rb quiet IDENTITY | stop IDENTITY
require 'json'
require 'sidekiq'
require 'sidekiq/api'

# Sidekiq 7+ speaks redis-client: no Redis constant to configure.
Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
Sidekiq.logger.level = Logger::WARN

def entries(set)
  set.map { |e| { 'score' => e.score, 'item' => e.item, 'error_backtrace' => e.error_backtrace } }
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
    job['created_at'] = job['enqueued_at'] = Time.now.to_f
    q = job['queue'] ||= 'default'
    Sidekiq.redis { |c| c.sadd('queues', q); c.lpush("queue:#{q}", JSON.generate(job)) }
    job['jid']
  when 'push_bulk' then Sidekiq::Client.push_bulk(JSON.parse(ARGV[0]))
  when 'push_in' then Sidekiq::Client.push(JSON.parse(ARGV[1]).merge('at' => Time.now.to_f + ARGV[0].to_f))
  when 'stats'
    s = Sidekiq::Stats.new
    { 'processed' => s.processed, 'failed' => s.failed, 'enqueued' => s.enqueued,
      'scheduled_size' => s.scheduled_size, 'retry_size' => s.retry_size,
      'dead_size' => s.dead_size, 'processes_size' => s.processes_size,
      'workers_size' => s.workers_size, 'queues' => s.queues,
      'history_processed' => Sidekiq::Stats::History.new(1).processed.values.first,
      'history_failed' => Sidekiq::Stats::History.new(1).failed.values.first }
  when 'processes' then Sidekiq::ProcessSet.new.map { |p| p.instance_variable_get(:@attribs) }
  when 'workers'
    Sidekiq::Workers.new.map { |pid, tid, work| { 'process' => pid, 'thread' => tid, 'work' => work } }
  when 'retries' then entries(Sidekiq::RetrySet.new)
  when 'dead' then entries(Sidekiq::DeadSet.new)
  when 'scheduled' then entries(Sidekiq::ScheduledSet.new)
  when 'queue_latency' then Sidekiq::Queue.new(ARGV[0] || 'default').latency
  when 'quiet' then find_process(ARGV[0]).quiet!; 'ok'
  when 'stop' then find_process(ARGV[0]).stop!; 'ok'
  else abort("unknown command #{cmd}")
  end
puts JSON.generate(out)
