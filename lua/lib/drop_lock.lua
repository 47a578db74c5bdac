-- uses: release_hold
-- drop_lock(locked, digests, jid, type, z): releases jid's hold on the
-- uniqueness lock hash locked, as v9's unlock (z as in zset_batch). type is
-- the lock type, or "force". Returns 1 when released (or nothing was left
-- to release), 0 when other jids hold it. until_expired locks are released
-- only when forced: their TTL is their life.
local function drop_lock(locked, digests, jid, type, z)
  if type == 'until_expired' then
    return 1
  end
  if release_hold(locked, digests, jid, z) then
    return 1
  end
  -- Not held by jid: released already, unless other jids hold it. An index
  -- entry left behind by a hash that expired goes too.
  if redis.call('HLEN', locked) == 0 then
    zset_put(z, digests, locked, false)
    return 1
  end
  return 0
end
