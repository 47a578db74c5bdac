-- Finish several successful jobs that hold no lock and belong to no batch:
-- each leaves the working list, as acks.lua's LREM from the tail would take
-- it (for each payload, its occurrence nearest the tail). A plain job pays
-- for no lock or batch field, and only its payload crosses into Lua.
-- The jobs of a round trip sit together in the list, headwards of older
-- jobs other processors still run or ack: one LREM a job would walk past
-- those once for each job, which costs Redis more than the rest of the ack.
-- So the list's tail from the newest job (the last, as they come oldest
-- first) on is read once and written back without the jobs, and only a job
-- not found there is removed by LREM: the same list either way.
-- KEYS[1] working list. ARGV the payloads as fetched, oldest first.
-- Returns {how many of the jobs were still in the working list, 0, ""}, as
-- acks.lua does.
local working, n, removed = KEYS[1], #ARGV, 0
local left = {}
for i = 1, n do
  left[ARGV[i]] = (left[ARGV[i]] or 0) + 1
end
-- Rewriting costs each older job once: worth it only while they are not
-- many more than the jobs.
local from = n >= 4 and redis.call('LPOS', working, ARGV[n], 'RANK', '-1', 'MAXLEN', tostring(8 * n))
if from then
  local tail = redis.call('LRANGE', working, from, -1)
  -- For each payload, its occurrences nearest the tail go first.
  local drop = {}
  for i = #tail, 1, -1 do
    local c = left[tail[i]]
    if c and c > 0 then
      left[tail[i]], drop[i] = c - 1, true
      removed = removed + 1
    end
  end
  local keep = {}
  for i = 1, #tail do
    if not drop[i] then
      keep[#keep + 1] = tail[i]
    end
  end
  if from == 0 then
    redis.call('DEL', working)
  else
    redis.call('LTRIM', working, 0, from - 1)
  end
  for i = 1, #keep, 100 do
    redis.call('RPUSH', working, unpack(keep, i, math.min(i + 99, #keep)))
  end
end
for v, c in pairs(left) do
  for _ = 1, c do
    removed = removed + redis.call('LREM', working, '-1', v)
  end
end
return { removed, 0, '' }
