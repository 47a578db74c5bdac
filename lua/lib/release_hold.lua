-- release_hold(locked, digests, jid): drops jid's hold on the uniqueness
-- lock hash locked ("<digest>:LOCKED"); when no holder is left the hash is
-- gone (Redis drops an empty hash) and the digest leaves the digests zset.
-- Returns true when jid held it.
local function release_hold(locked, digests, jid)
  if redis.call('HDEL', locked, jid) == 0 then
    return false
  end
  if redis.call('HLEN', locked) == 0 then
    redis.call('ZREM', digests, (string.gsub(locked, ':LOCKED$', '')))
  end
  return true
end
