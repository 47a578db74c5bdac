-- uses: zset_batch
-- release_hold(locked, digests, jid, z): drops jid's hold on the
-- uniqueness lock hash locked ("<digest>:LOCKED"); when no holder is left
-- the hash is gone (Redis drops an empty hash) and the digest leaves the
-- digests zset (z as in zset_batch). Returns true when jid held
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
