-- drop_lock(locked, digests, jid, type): releases jid's hold on the
-- uniqueness lock hash locked, as v9's unlock (needs release_hold). type is
-- the lock type, or "force". Returns 1 when released (or nothing was left
-- to release), 0 when other jids hold it. until_expired locks are released
-- only when forced: their TTL is their life.
local function drop_lock(locked, digests, jid, type)
  if type == 'until_expired' then
    return 1
  end
  if release_hold(locked, digests, jid) then
    return 1
  end
  -- Not held by jid: released already, unless other jids hold it. An index
  -- entry left behind by a hash that expired goes too.
  if redis.call('HLEN', locked) == 0 then
    redis.call('ZREM', digests, (string.gsub(locked, ':LOCKED$', '')))
    return 1
  end
  return 0
end
