-- Reliable fetch: move up to ARGV[1] of the oldest jobs, from the queues in
-- the order given, into this process's working list, in one step, so a job
-- is never only in memory.
-- KEYS[1..n-1] queue lists in the order to try; KEYS[n] the working list.
-- ARGV[1] how many jobs at most; ARGV[2] "1": also say, for each job that
-- carries a lock_digest, whether "<lock_digest>:LOCKED" is held by its jid
-- (the check the server would otherwise make in a round trip of its own).
-- The fields are found by pattern, not parsed: the caller compares them
-- with its own parse before trusting the answer.
-- Returns a flat array, four entries a job: the queue's index (1-based),
-- the payload, and the digest and jid found held ("" and "" when not
-- checked or not held). An empty array when every queue is empty.
local working = KEYS[#KEYS]
local want = tonumber(ARGV[1]) or 1
local check = ARGV[2] == '1'
local out = {}
local got = 0
for i = 1, #KEYS - 1 do
  while got < want do
    local job = redis.call('LMOVE', KEYS[i], working, 'RIGHT', 'LEFT')
    if not job then
      break
    end
    got = got + 1
    local digest, jid = '', ''
    if check and string.find(job, '"lock_digest"', 1, true) then
      local d = string.match(job, '"lock_digest":"([^"\\]+)"')
      local j = string.match(job, '"jid":"([^"\\]+)"')
      if d and j and redis.call('HEXISTS', d .. ':LOCKED', j) == 1 then
        digest, jid = d, j
      end
    end
    out[#out + 1] = i
    out[#out + 1] = job
    out[#out + 1] = digest
    out[#out + 1] = jid
  end
  if got >= want then
    break
  end
end
return out
