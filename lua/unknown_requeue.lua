-- uses: fits
-- Put a job whose class has no handler back untouched: at the end of its
-- queue fetched last, or (ARGV[2], a score) in the retry set, and out of
-- the working list (reliable fetch) in the same step, only if it is still
-- there. The key's type is checked first, as the push would fail after
-- the LREM.
-- KEYS[1] the working list, '' for the basic fetch; KEYS[2] the queue
-- list or the retry set. ARGV[1] the payload, ARGV[2] its score, '' for
-- the queue.
-- Returns 1 moved, 0 no longer in the working list, -1 the key holds
-- another type.
local zset = ARGV[2] ~= ''
if not fits(KEYS[2], zset and 'zset' or 'list') then
  return -1
end
if KEYS[1] ~= '' and redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then
  return 0
end
if zset then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
else
  redis.call('LPUSH', KEYS[2], ARGV[1])
end
return 1
