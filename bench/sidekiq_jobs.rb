# Ruby Sidekiq 6.4.1 side of bench/run: the same job classes as
# bench/jobs.c, for `sidekiq -r bench/sidekiq_jobs.rb`.
#
#   NoopJob [...]   does nothing; after the BENCH_JOBS-th one, this process
#                   writes the epoch time into bench:done (basic fetch leaves
#                   no trace of the last job in Redis, so the drain timer
#                   needs this stamp to see the end)
#   SleepJob [...]  sleeps 2 ms (a job waiting on I/O), then counts as NoopJob
#   LatencyJob KEY  RPUSHes to KEY the microseconds between the job's
#                   enqueued_at and the start of its server middleware chain
#
# Per-job logging is off (level WARN), as in Sidekiq's own load benchmark.
# redis-rb 4.8 warns on stderr at every BRPOP that Sidekiq 6.4.1 passes the
# timeout positionally: silenced, or Ruby would pay for one warning per job.
require 'sidekiq'

Sidekiq.logger.level = Logger::WARN
Redis.silence_deprecations = true
Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)

class NoopJob
  include Sidekiq::Worker

  TARGET = Integer(ENV.fetch('BENCH_JOBS', '0'))
  LOCK = Mutex.new
  @done = 0

  class << self
    attr_accessor :done
  end

  def perform(*)
    n = LOCK.synchronize { NoopJob.done += 1 }
    return unless n == TARGET

    Sidekiq.redis { |c| c.set('bench:done', format('%.6f', Time.now.to_f)) }
  end
end

class SleepJob < NoopJob
  def perform(*)
    sleep 0.002
    super
  end
end

# Reads the clock as the job starts, before the worker's perform.
class BenchLatencyStart
  def call(_worker, job, _queue)
    if job['class'] == 'LatencyJob'
      enq = job['enqueued_at'].to_f
      enq /= 1000.0 if job['enqueued_at'].is_a?(Integer) # Sidekiq 8 millis
      Thread.current[:bench_latency_us] = ((Time.now.to_f - enq) * 1e6).to_i
    end
    yield
  end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add BenchLatencyStart }
end

class LatencyJob
  include Sidekiq::Worker

  def perform(key)
    Sidekiq.redis { |c| c.rpush(key, Thread.current[:bench_latency_us]) }
  end
end
