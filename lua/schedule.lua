-- uses: fits
-- Move one due job from a sorted set (schedule or retry) to its queue. The
-- ZREM decides: when two schedulers race for the same job only the one that
-- removed it pushes it. A queue key of another type would refuse the push
-- after the ZREM (a script is not rolled back), so it is checked first and
-- the job stays where it is.
-- KEYS[1] zset, KEYS[2] queue list, KEYS[3] "queues" set.
-- ARGV[1] member as stored, ARGV[2] payload to push, ARGV[3] queue name.
-- Returns 1 moved, 0 gone (another took it), -1 the queue key is not a list.
if not fits(KEYS[2], 'list') then
  return -1
end
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('SADD', KEYS[3], ARGV[3])
  return 1
end
return 0
