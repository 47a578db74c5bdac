-- After plain HDELs released runtime locks (a job's "<digest>:RUN:LOCKED",
-- sent just before this call in the same round trip: fetch/reliable.c),
-- the digest of each such hash no holder kept leaves uniquejobs:digests,
-- as lib/release_hold.lua. A runtime lock is its run's own and goes with
-- the job's ack whether or not the job was still in the working list, so
-- its release needs nothing the ack reads; as plain commands, it costs
-- Redis no argument into Lua but the hash's name.
-- KEYS[1] "uniquejobs:digests", then the lock hashes.
-- Returns how many digests left the index.
local keys, rem = KEYS, {}
-- Usually no hash kept a holder: asked once for them all.
local any = redis.call('EXISTS', unpack(keys, 2)) > 0
for j = 2, #keys do
  local l = keys[j]
  if not any or redis.call('HLEN', l) == 0 then
    rem[#rem + 1] = string.find(l, ':LOCKED', -7, true) and string.sub(l, 1, -8) or l
  end
end
if #rem > 0 then
  redis.call('ZREM', keys[1], unpack(rem))
end
return #rem
