-- take_out(working, args, step, first): for the n jobs args[first],
-- args[first + step], ... (first 1 when nil; payloads as fetched, in the
-- order their acks came, oldest first),
-- a function take(payload), called once for each of them in that order,
-- that takes the job out of the working list as LREM from the tail would
-- (its occurrence nearest the tail) and says whether it was there; and
-- whether the tail was read (when not, take is that LREM alone).
-- The jobs of a round trip sit together in the list, headwards of older
-- jobs other processors still run or ack; one LREM a job walks past those
-- once for each job. With many jobs behind many older ones that walk
-- costs Redis more than the rest of the ack, and the tail from the newest
-- job (the last) on is read once here and written back without the jobs
-- instead; take then removes by LREM only a job not found there: the same
-- list either way. Moving a job through Lua costs Redis about as much as
-- walking past 20 (its string is copied and hashed twice), so with few
-- jobs, or few older ones, the LREMs are cheaper.
local function take_out(working, args, step, first)
  local function lrem(v)
    return redis.call('LREM', working, '-1', v) == 1
  end
  first = first or 1
  local n = math.floor((#args - first + step) / step)
  local from = n >= 32
    and redis.call('LPOS', working, args[first + (n - 1) * step], 'RANK', '-1', 'MAXLEN', tostring(8 * n))
  if not from or redis.call('LLEN', working) - from - n < 16 then
    return lrem, false
  end
  local left, found = {}, {}
  for i = first, #args, step do
    left[args[i]] = (left[args[i]] or 0) + 1
  end
  local tail = redis.call('LRANGE', working, from, -1)
  local drop, keep = {}, {}
  for i = #tail, 1, -1 do
    local c = left[tail[i]]
    if c and c > 0 then
      left[tail[i]], drop[i] = c - 1, true
      found[tail[i]] = (found[tail[i]] or 0) + 1
    end
  end
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
  return function(v)
    local c = found[v]
    if c and c > 0 then
      found[v] = c - 1
      return true
    end
    return lrem(v)
  end, true
end
