# Pushes through Capstan::Shards (examples/ruby/capstan_shards.rb) for the
# routing tests (test_routing.c). SHARDS is "a=URL,b=URL,c=URL" in
# capstan.yml's order, HOME "queue=shard,..." or "-".
#
#   ruby shards.rb picks N                  N random keys: "JOB hex(key) shard" over
#                                           the shards alpha, b-2, c_3, d
#   ruby shards.rb push SHARDS HOME N       N PlainJob pushes (half through
#                                           push, half through via_for), N/10
#                                           to queue reports: "JOB jid shard queue"
#   ruby shards.rb unique SHARDS HOME N     N pushes of UniqueJob [3] (until_executed),
#                                           with a stand-in for v9's client
#                                           middleware: "JOB jid-or-denied shard"
#   ruby shards.rb explicit SHARDS HOME SHARD   one push to SHARD: "JOB jid shard", or
#                                           "ERROR class: message"
require 'json'
require 'digest'
require 'securerandom'
require_relative '../../examples/ruby/capstan_shards'

# redis-rb 4.8 (Sidekiq 6.4) warns on every SADD otherwise.
Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)

class PlainJob
  include Sidekiq::Worker
  sidekiq_options queue: 'default'
  def perform(*); end
end

class UniqueJob
  include Sidekiq::Worker
  sidekiq_options queue: 'default', lock: :until_executed
  def perform(*); end
end

# What sidekiq-unique-jobs v9's client middleware does for until_executed
# (the gem is not installed), in the Redis of the push: the digest as v9
# computes it (tests/ruby/unique.rb), written into the payload, and the
# lock taken when no jid holds it, the push refused when another does.
class V9Standin
  LOCK = "if redis.call('HLEN', KEYS[1]) > 0 then return 0 end " \
         "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) return 1"

  def call(_cls, job, _queue, pool)
    return yield unless job['lock']

    args = job['args']
    d = 'uniquejobs:' + Digest::MD5.hexdigest(JSON.generate({ 'class' => job['class'].to_s,
                                                              'queue' => job['queue'],
                                                              'lock_args' => args }.sort))
    meta = JSON.generate({ 'worker' => job['class'].to_s, 'queue' => job['queue'], 'limit' => nil,
                           'timeout' => 0, 'ttl' => nil, 'type' => job['lock'].to_s,
                           'lock_args' => args, 'time' => Time.now.to_f, 'at' => nil })
    got = pool.with { |r| r.call('EVAL', LOCK, '1', "#{d}:LOCKED", job['jid'], meta) }
    return nil unless got == 1

    pool.with { |r| r.call('ZADD', 'uniquejobs:digests', Time.now.to_f.to_s, d) }
    job.merge!('lock' => job['lock'].to_s, 'lock_timeout' => 0, 'lock_ttl' => nil,
               'lock_prefix' => 'uniquejobs', 'lock_args' => args, 'lock_digest' => d)
    yield
  end
end

def configure(spec, home)
  shards = spec.split(',').to_h { |kv| kv.split('=', 2) }.transform_values { |u| { url: u, size: 2 } }
  home = home == '-' ? {} : home.split(',').to_h { |kv| kv.split('=', 2) }
  Capstan::Shards.configure(shards: shards, home: home)
end

$stdout.sync = true
cmd = ARGV.shift
case cmd
when 'picks'
  names = %w[alpha b-2 c_3 d]
  Capstan::Shards.configure(shards: names.to_h { |n| [n, Object.new] })
  rng = Random.new
  ARGV[0].to_i.times do |i|
    key = case i % 3
          when 0 then SecureRandom.hex(rng.rand(1..20))
          when 1 then rng.bytes(rng.rand(0..40))
          else "uniquejobs:#{SecureRandom.hex(16)}é"
          end
    puts "JOB #{key.unpack1('H*')} #{Capstan::Shards.pick(key)}"
  end
when 'push'
  configure(ARGV[0], ARGV[1])
  n = ARGV[2].to_i
  n.times do |i|
    if i.even?
      jid, shard = Capstan::Shards.push(PlainJob, i)
    else
      item = { 'class' => PlainJob, 'args' => [i] }
      pool = Capstan::Shards.via_for(item)
      jid = Sidekiq::Client.via(pool) { Sidekiq::Client.push(item) }
      shard = Capstan::Shards.names.find { |s| Capstan::Shards.pool(s).equal?(pool) }
    end
    puts "JOB #{jid} #{shard} default"
  end
  (n / 10).times do |i|
    jid, shard = Capstan::Shards.push(PlainJob, i, queue: 'reports')
    puts "JOB #{jid} #{shard} reports"
  end
when 'unique'
  Sidekiq.configure_client { |c| c.client_middleware { |ch| ch.add V9Standin } }
  configure(ARGV[0], ARGV[1])
  ARGV[2].to_i.times do
    jid, shard = Capstan::Shards.push(UniqueJob, 3)
    puts "JOB #{jid || 'denied'} #{shard} #{Capstan::Shards.digest('class' => UniqueJob, 'args' => [3])}"
  end
when 'explicit'
  configure(ARGV[0], ARGV[1])
  begin
    jid, shard = Capstan::Shards.push(PlainJob, 1, shard: ARGV[2])
    puts "JOB #{jid} #{shard}"
  rescue ArgumentError => e
    puts "ERROR #{e.class}: #{e.message}"
  end
else
  abort("unknown command #{cmd}")
end
