-- uses: take_lock
-- Take a uniqueness lock for one jid, in v9's format: the hash
-- "<digest>:LOCKED" (jid -> metadata JSON) indexed in "uniquejobs:digests".
-- KEYS[1] the locked hash, KEYS[2] the digests zset, KEYS[3] (optional) the
-- waiting zset of jids queued for this lock in arrival order.
-- ARGV[1] jid, ARGV[2] ttl in ms (0 = none), ARGV[3] lock type,
-- ARGV[4] limit, ARGV[5] metadata JSON, ARGV[6] now (float seconds),
-- ARGV[7] arrival time of this waiter, ARGV[8] waiters that arrived before
-- this score gave up long ago (crashed) and are dropped.
-- Returns 2 when jid already held it (no refresh, as v9), 1 when taken,
-- 0 when the limit is reached, -1 when earlier waiters go first.
local locked, digests, jid = KEYS[1], KEYS[2], ARGV[1]
local waiting = KEYS[3]
if waiting then
  if redis.call('HEXISTS', locked, jid) == 1 then
    redis.call('ZREM', waiting, jid)
    return 2
  end
  redis.call('ZADD', waiting, 'NX', ARGV[7], jid)
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', '(' .. ARGV[8])
  local first = redis.call('ZRANGE', waiting, 0, 0)[1]
  if first and first ~= jid then
    return -1
  end
end
local taken = take_lock(locked, digests, jid, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
if waiting and taken == 1 then
  redis.call('ZREM', waiting, jid)
end
return taken
