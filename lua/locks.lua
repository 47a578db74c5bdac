-- uses: zset_batch
-- uses: drop_lock
-- uses: take_lock
-- Take the runtime locks of several jobs about to run, in one call (they
-- would otherwise cost a script call each): for each job, in order, its
-- until-lock goes first when it has one (until_and_while_executing), as
-- unlock.lua does, and then, only if that release was not refused, its
-- runtime lock is taken as lock.lua takes it without waiting.
-- KEYS[1] "uniquejobs:digests", then each job's lock hashes below, declared
-- (every key a script touches is in KEYS: Dragonfly, cluster proxies).
-- ARGV[1] now (float seconds); then groups of 7: the runtime lock hash
-- "<digest>:RUN:LOCKED", the until-lock hash to release first ("" for
-- none), jid, ttl in ms (0 = none), lock type, limit, metadata JSON.
-- Returns one string, two digits a job (a client allocates each reply
-- entry): the release's result (1 when there was none) and the lock's
-- (lib/take_lock.lua; 0 when the release was refused); "99" for a job one
-- of whose commands failed (a key of another type), which leaves the other
-- jobs' results as they are.
local digests, now, out, z = KEYS[1], ARGV[1], {}, {}
-- Each job's two digits, made once: a number joined to a string goes
-- through sprintf.
local DIGITS = { [0] = { [0] = '00', '01', '02' }, [1] = { [0] = '10', '11', '12' } }
local function one(i)
  local released, taken = 1, 0
  if ARGV[i + 1] ~= '' then
    released = drop_lock(ARGV[i + 1], digests, ARGV[i + 2], ARGV[i + 4], z)
  end
  if released == 1 then
    taken = take_lock(ARGV[i], digests, ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5],
                      ARGV[i + 6], now, z)
  end
  return DIGITS[released][taken]
end
for i = 2, #ARGV, 7 do
  local ok, digits = pcall(one, i)
  out[#out + 1] = ok and digits or '99'
end
-- The index written last: when it fails (not a zset) every job failed.
if not pcall(zset_flush, z, digests) then
  for i = 1, #out do
    out[i] = '99'
  end
end
return table.concat(out)
