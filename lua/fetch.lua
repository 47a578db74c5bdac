-- Reliable fetch: move up to ARGV[1] of the oldest jobs, from the queues in
-- the order given, into this process's working list, in one step, so a job
-- is never only in memory.
-- KEYS[1..n-1] queue lists in the order to try; KEYS[n] the working list.
-- ARGV[1] how many jobs at most; ARGV[2] "1": also say, for each job that
-- carries a lock_digest, whether "<lock_digest>:LOCKED" is held by its jid
-- (the check the server would otherwise make in a round trip of its own).
-- The fields are found by plain search, not parsed: the caller compares
-- them with its own parse before trusting the answer.
-- Returns a flat array: Redis's clock in microseconds (scripts run one at a
-- time, so it orders the fetches of every connection as Redis ran them),
-- then two entries a job: the queue's index (1-based), or {index, digest,
-- jid} when the job's lock was found held by its jid; and the payload. (As
-- few reply entries as can be: a client allocates each.) The clock alone
-- when every queue is empty.
local working = KEYS[#KEYS]
-- The string value of the first "name":"..." in job, by plain search (a
-- pattern match costs several times more), or nil.
local function field(job, name)
  local _, e = string.find(job, name, 1, true)
  if not e then
    return nil
  end
  local q = string.find(job, '"', e + 1, true)
  if not q or q == e + 1 then
    return nil
  end
  local v = string.sub(job, e + 1, q - 1)
  if string.find(v, '\\', 1, true) then
    return nil
  end
  return v
end
local want = tonumber(ARGV[1]) or 1
local check = ARGV[2] == '1'
local now = redis.call('TIME')
local out = { tonumber(now[1]) * 1000000 + tonumber(now[2]) }
local got = 0
-- From each queue in turn, the oldest jobs (the right end) in one range:
-- three commands for the lot instead of one move per job. They go to the
-- working list's left end oldest first, as one move per job would leave
-- them.
for i = 1, #KEYS - 1 do
  local jobs = redis.call('LRANGE', KEYS[i], got - want, -1)
  local n = #jobs
  if n > 0 then
    redis.call('LTRIM', KEYS[i], 0, -n - 1)
    local oldest_first = {}
    for k = n, 1, -1 do
      oldest_first[#oldest_first + 1] = jobs[k]
    end
    redis.call('LPUSH', working, unpack(oldest_first))
    got = got + n
    for _, job in ipairs(oldest_first) do
      local held = i
      local d = check and field(job, '"lock_digest":"')
      -- The server uses the answer for until_executed and until_expired
      -- jobs only; a runtime lock is never held by a job being fetched.
      local lock = d and field(job, '"lock":"')
      if lock == 'while_executing' or lock == 'until_and_while_executing'
          or lock == 'while_executing_reject' then
        d = nil
      end
      if d then
        local j = field(job, '"jid":"')
        if j and redis.call('HEXISTS', d .. ':LOCKED', j) == 1 then
          held = { i, d, j }
        end
      end
      out[#out + 1] = held
      out[#out + 1] = job
    end
  end
  if got >= want then
    break
  end
end
return out
