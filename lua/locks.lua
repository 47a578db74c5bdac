-- uses: zset_batch
-- uses: drop_lock
-- uses: take_lock
-- Take the runtime locks of several jobs about to run, in one call (they
-- would otherwise cost a script call each): for each job, in order, its
-- until-lock goes first when it has one (until_and_while_executing), as
-- unlock.lua does, and then, only if that release was not refused, its
-- runtime lock is taken as lock.lua takes it without waiting.
-- KEYS[1] "uniquejobs:digests", then each job's runtime lock hash
-- "<digest>:RUN:LOCKED", in the jobs' order, then the until-lock hashes
-- released first (every key a script touches is in KEYS: Dragonfly,
-- cluster proxies).
-- ARGV[1] now (float seconds), ARGV[2] one byte a job: "s" for the short
-- form, a job with no until-lock, no TTL and a limit of 1, whose group is
-- its jid and metadata JSON; "l" for the long form, whose group is the
-- until-lock hash ("" for none), jid, ttl in ms (0 = none), lock type,
-- limit, metadata JSON. Then the groups, in the jobs' order. (Each
-- argument costs Redis more than most commands' work on it: the common
-- job sends two.)
-- Returns one string, two digits a job (a client allocates each reply
-- entry): the release's result (1 when there was none) and the lock's
-- (lib/take_lock.lua; 0 when the release was refused); "99" for a job one
-- of whose commands failed (a key of another type), which leaves the other
-- jobs' results as they are.
local keys, argv = KEYS, ARGV
local digests, now, kinds, out, z = keys[1], argv[1], argv[2], {}, {}
-- Whether any of the runtime lock hashes exists, asked once for them all:
-- when none does, a job in the short form takes its lock with one
-- command. A hash named a second time is counted then.
local none = #kinds > 0 and redis.pcall('EXISTS', unpack(keys, 2, #kinds + 1)) == 0
local seen = {}
-- Each job's two digits, made once: a number joined to a string goes
-- through sprintf.
local DIGITS = { [0] = { [0] = '00', '01', '02' }, [1] = { [0] = '10', '11', '12' } }
local function one(locked, until_lock, jid, ttl, type, limit, meta)
  local released, taken = 1, 0
  if until_lock ~= '' then
    released = drop_lock(until_lock, digests, jid, type, z)
  end
  if released == 1 then
    seen[locked] = true
    taken = take_lock(locked, digests, jid, ttl, type, limit, meta, now, z)
  end
  return DIGITS[released][taken]
end
local a = 3
for j = 1, #kinds do
  local locked, ok, digits = keys[j + 1], false, nil
  if string.byte(kinds, j) == 115 then
    local jid, meta = argv[a], argv[a + 1]
    a = a + 2
    if none and not seen[locked] and string.find(locked, ':LOCKED', -7, true) then
      -- As take_lock with no holder, no TTL and no until-lock to release.
      seen[locked] = true
      ok = type(redis.pcall('HSET', locked, jid, meta)) == 'number'
      if ok then
        z[string.sub(locked, 1, -8)] = now
      end
      digits = '11'
    else
      ok, digits = pcall(one, locked, '', jid, '0', '', '1', meta)
    end
  else
    ok, digits = pcall(one, locked, argv[a], argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4],
                       argv[a + 5])
    a = a + 6
  end
  out[j] = ok and digits or '99'
end
-- The index written last: when it fails (not a zset) every job failed.
if not pcall(zset_flush, z, digests) then
  for i = 1, #out do
    out[i] = '99'
  end
end
return table.concat(out)
