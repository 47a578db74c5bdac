-- Opens batch bid for additions: creates it ("new") or reopens it
-- ("reopen"); either way one more handle holds it open, and its callbacks
-- wait until every handle has committed (batch_commit.lua).
-- KEYS[1] "batch:BID", KEYS[2] "batches"; for "new", KEYS[3]
-- "batch:BID:jids", KEYS[4] "batches:open" (the bids not succeeded yet) and,
-- with a parent, KEYS[5] "batch:PARENT".
-- ARGV[1] bid, ARGV[2] "new" | "reopen", ARGV[3] parent bid or "",
-- ARGV[4] seconds the data lives after the last addition, ARGV[5..] field,
-- value pairs stored with a new batch (description, linger, callbacks).
-- Errors start with NOTFOUND, DENIED or EXISTS, for the caller to tell apart.
local key, bid, parent = KEYS[1], ARGV[1], ARGV[3]
local function usable(k, name)
  if redis.call('EXISTS', k) == 0 then
    return redis.error_reply('NOTFOUND no batch ' .. name)
  end
  if redis.call('HEXISTS', k, 'success_at') == 1 then
    return redis.error_reply('DENIED batch ' .. name .. ' has already succeeded')
  end
end
if ARGV[2] == 'reopen' then
  local refused = usable(key, bid)
  if refused then
    return refused
  end
  return redis.call('HINCRBY', key, 'open', 1)
end
if redis.call('EXISTS', key) == 1 then
  return redis.error_reply('EXISTS batch ' .. bid .. ' exists already')
end
if parent ~= '' then
  -- The child is one job of its parent, pending until the child succeeds.
  local pkey = KEYS[5]
  local refused = usable(pkey, parent)
  if refused then
    return refused
  end
  redis.call('HINCRBY', pkey, 'total', 1)
  redis.call('HINCRBY', pkey, 'pending', 1)
  redis.call('HINCRBY', pkey, 'notrun', 1)
end
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('HSET', key, 'created_at', now, 'total', 0, 'pending', 0, 'notrun', 0, 'dead', 0,
  'open', 1)
for i = 5, #ARGV, 2 do
  redis.call('HSET', key, ARGV[i], ARGV[i + 1])
end
if parent ~= '' then
  redis.call('HSET', key, 'parent', parent)
end
-- The jids hash exists from the start (its field "" is no jid), so the
-- acks that fill it need not give it an expiry each.
redis.call('HSET', KEYS[3], '', '')
redis.call('EXPIRE', key, ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[4])
redis.call('ZADD', KEYS[2], now, bid)
redis.call('ZADD', KEYS[4], now, bid)
return 1
