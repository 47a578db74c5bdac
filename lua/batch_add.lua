-- Counts n more jobs in batch bid before they are pushed (so none can
-- finish uncounted), or takes back -n that could not be pushed, and keeps
-- the batch's data for another expiry seconds; n = 0 only checks that the
-- batch takes jobs (exists and has not succeeded).
-- KEYS[1] "batch:BID", KEYS[2] "batch:BID:jids", KEYS[3] "batch:BID:failures".
-- ARGV[1] n, ARGV[2] expiry seconds.
local key, n = KEYS[1], tonumber(ARGV[1])
if redis.call('EXISTS', key) == 0 then
  return redis.error_reply('NOTFOUND no batch ' .. key)
end
if n >= 0 and redis.call('HEXISTS', key, 'success_at') == 1 then
  return redis.error_reply('DENIED ' .. key .. ' has already succeeded')
end
redis.call('HINCRBY', key, 'total', n)
redis.call('HINCRBY', key, 'pending', n)
redis.call('HINCRBY', key, 'notrun', n)
for _, k in ipairs({ key, KEYS[2], KEYS[3] }) do
  redis.call('EXPIRE', k, ARGV[2])
end
return redis.call('HGET', key, 'total')
