-- release_hold(locked, digests, jid, z): drops jid's hold on the
-- uniqueness lock hash locked ("<digest>:LOCKED"); when no holder is left
-- the hash is gone (Redis drops an empty hash) and the digest leaves the
-- digests zset (needs zset_batch; z as there). Returns true when jid held
-- it.
local function release_hold(locked, digests, jid, z)
  if redis.call('HDEL', locked, jid) == 0 then
    return false
  end
  if redis.call('HLEN', locked) == 0 then
    zset_put(z, digests, locked, false)
  end
  return true
end
