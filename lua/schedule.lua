-- Move one due job from a sorted set (schedule or retry) to its queue. The
-- ZREM decides: when two schedulers race for the same job only the one that
-- removed it pushes it.
-- KEYS[1] zset, KEYS[2] queue list, KEYS[3] "queues" set.
-- ARGV[1] member as stored, ARGV[2] payload to push, ARGV[3] queue name.
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('SADD', KEYS[3], ARGV[3])
  redis.call('LPUSH', KEYS[2], ARGV[2])
  return 1
end
return 0
