# Takes, reads and drops queued locks exactly as the redis_queued_locks gem
# (1.16) does, with the plain redis gem, since the gem itself is not
# installed: same keys, fields, acquirer ids, and the same WATCH/MULTI
# attempt. The qlock tests use it to show capstan and the gem contend for one
# lock.
#
#   ruby qlock.rb try NAME TTL_MS [QUEUE_TTL_S]  one attempt; prints JSON
#                                                {ok, result, acq_id}; a
#                                                failed attempt leaves the queue
#   ruby qlock.rb info NAME                      prints JSON {locked, queued,
#                                                info, queue} as the gem's
#                                                locked?/queued?/lock_info/queue_info
#   ruby qlock.rb unlock NAME                    the gem's unlock (drops the
#                                                lock and every waiter)
require 'fiber'
require 'json'
require 'redis'
require 'securerandom'

redis = Redis.new(url: ENV.fetch('REDIS_URL'))
identity = SecureRandom.hex(8)
pid = Process.pid
thread = Thread.current.object_id
ractor = Ractor.current.object_id
acq_id = "rql:acq:#{pid}/#{thread}/#{Fiber.current.object_id}/#{ractor}/#{identity}"
hst_id = "rql:hst:#{pid}/#{thread}/#{ractor}/#{identity}"

mode, name = ARGV[0], ARGV[1]
lock_key = "rql:lock:#{name}"
queue_key = "rql:lock_queue:#{name}"

def try_lock(redis, lock_key, queue_key, acq_id, hst_id, ttl, queue_ttl)
  position = Time.now.to_f
  result = nil
  redis.watch(lock_key) do
    redis.zadd(queue_key, position, acq_id, nx: true)
    redis.zremrangebyscore(queue_key, '-inf', Time.now.to_f - queue_ttl)
    head = redis.zrange(queue_key, 0, 0).first
    if head.nil?
      result = :dead_score_reached
      redis.unwatch
    elsif head != acq_id
      result = :acquirer_is_not_first_in_queue
      redis.unwatch
    elsif redis.hget(lock_key, 'acq_id')
      result = :lock_is_still_acquired
      redis.unwatch
    else
      res = redis.multi do |tx|
        tx.zrem(queue_key, acq_id)
        tx.hset(lock_key, 'acq_id', acq_id, 'hst_id', hst_id, 'ts', Time.now.to_f,
                'ini_ttl', ttl, 'owner', 'ruby')
        tx.pexpire(lock_key, ttl)
      end
      result = res.nil? ? :lock_is_acquired_during_acquire_race : :lock_obtaining
    end
  end
  redis.zrem(queue_key, acq_id) unless result == :lock_obtaining
  result
end

case mode
when 'try'
  ttl = Integer(ARGV[2])
  queue_ttl = Float(ARGV[3] || '15')
  result = try_lock(redis, lock_key, queue_key, acq_id, hst_id, ttl, queue_ttl)
  puts JSON.generate(ok: result == :lock_obtaining, result: result, acq_id: acq_id)
when 'info'
  info = redis.hgetall(lock_key)
  unless info.empty?
    info['ts'] = Float(info['ts'])
    info['ini_ttl'] = Integer(info['ini_ttl'])
    info['lock_key'] = lock_key
    info['rem_ttl'] = redis.pttl(lock_key)
  end
  queue = redis.zrange(queue_key, 0, -1, with_scores: true).map { |a, s| { acq_id: a, score: s } }
  puts JSON.generate(locked: redis.exists?(lock_key), queued: redis.exists?(queue_key),
                     info: info.empty? ? nil : info, queue: queue)
when 'unlock'
  res = redis.multi do |tx|
    tx.zremrangebyscore(queue_key, '-inf', '+inf')
    tx.expire(lock_key, 0)
  end
  puts JSON.generate(queue_res: res[0].positive?, lock_res: res[1] == true || res[1] == 1)
else
  warn "usage: qlock.rb try|info|unlock NAME ..."
  exit 64
end
