-- uses: release_hold
-- Release one jid's hold on a uniqueness lock (v9's unlock).
-- KEYS[1] the locked hash, KEYS[2] the digests zset.
-- ARGV[1] jid, ARGV[2] lock type, or "force".
-- Returns 1 when released (or nothing was left to release), 0 when other
-- jids hold it. until_expired locks are released only when forced: their
-- TTL is their life.
local locked, digests, jid = KEYS[1], KEYS[2], ARGV[1]
if ARGV[2] == 'until_expired' then
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
