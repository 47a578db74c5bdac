-- Reliable fetch: move up to ARGV[1] of the oldest jobs, from the queues in
-- the order given, into this process's working list, in one step, so a job
-- is never only in memory.
-- KEYS[1..n-1] queue lists in the order to try; KEYS[n] the working list.
-- ARGV[1] how many jobs at most; ARGV[2] "1": also say, for each job that
-- carries a lock_digest, whether "<lock_digest>:LOCKED" is held by its jid
-- (the check the server would otherwise make in a round trip of its own).
-- The fields are found by plain search, not parsed: the caller compares
-- them with its own parse before trusting the answer.
-- With caps on queues (locks/queue_limit.h), ARGV[3] the number n of
-- queues, ARGV[4] a slot's lease (ms), and for queue i ARGV[4+2i-1..4+2i]
-- the sizes of its two caps (0: none) and KEYS[n+1+2i-1..n+1+2i] their
-- held zsets: a queue is fetched from only while its caps have room, and
-- each job takes a slot of each, held by "job:<jid>".
-- Returns a flat array: Redis's clock in microseconds (scripts run one at a
-- time, so it orders the fetches of every connection as Redis ran them),
-- then two entries a job: the queue's index (1-based), or {index, digest,
-- jid} when the job's lock was found held by its jid; and the payload. (As
-- few reply entries as can be: a client allocates each.) The clock alone
-- when every queue is empty. From one queue without caps or the lock
-- check: the payloads, oldest first, then the clock.
local nq = tonumber(ARGV[3]) or #KEYS - 1
local working = KEYS[nq + 1]
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
local now_ms = math.floor(out[1] / 1000)
local lease = tonumber(ARGV[4])
-- The slots queue i's caps have free (nil: no cap).
local function room(i)
  local free
  for k = 1, 2 do
    local size = tonumber(ARGV[2 + 2 * i + k] or '0')
    if size > 0 then
      local held = KEYS[nq + 2 * i - 1 + k]
      redis.call('ZREMRANGEBYSCORE', held, '-inf', now_ms)
      local n = size - redis.call('ZCARD', held)
      if not free or n < free then
        free = n
      end
    end
  end
  return free
end
local function take_slots(i, job)
  local id = 'job:' .. (field(job, '"jid":"') or (now_ms .. ':' .. #out))
  for k = 1, 2 do
    if tonumber(ARGV[2 + 2 * i + k] or '0') > 0 then
      local held = KEYS[nq + 2 * i - 1 + k]
      redis.call('ZADD', held, now_ms + lease, id)
      if redis.call('PTTL', held) < lease then
        redis.call('PEXPIRE', held, lease)
      end
    end
  end
end
-- One queue, no caps, no lock to look for: the popped jobs are the reply,
-- with the clock last ({clock} alone when the queue is empty), so that a
-- job costs its payload's reply entry and nothing else.
if nq == 1 and not check and not lease then
  local jobs = want > 0 and redis.call('RPOP', KEYS[1], want)
  if not jobs then
    return out
  end
  redis.call('LPUSH', working, unpack(jobs))
  jobs[#jobs + 1] = out[1]
  return jobs
end
-- From each queue in turn, the oldest jobs (the right end), oldest first,
-- in one pop: two commands for the lot instead of one move per job. They
-- go to the working list's left end oldest first, as one move per job
-- would leave them.
local m = 1
for i = 1, nq do
  local take, free = want - got, lease and room(i)
  if free and free < take then
    take = free
  end
  local jobs = take > 0 and redis.call('RPOP', KEYS[i], take) or false
  local n = jobs and #jobs or 0
  if n > 0 then
    redis.call('LPUSH', working, unpack(jobs))
    got = got + n
  end
  if n > 0 and not check and not free then
    -- A plain sweep: each job's entries and nothing else.
    for k = 1, n do
      out[m + 1] = i
      out[m + 2] = jobs[k]
      m = m + 2
    end
  elseif n > 0 then
    for _, job in ipairs(jobs) do
      if free then
        take_slots(i, job)
      end
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
      out[m + 1] = held
      out[m + 2] = job
      m = m + 2
    end
  end
  if got >= want then
    break
  end
end
return out
