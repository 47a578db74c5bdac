-- Reliable fetch: move the oldest job of the first non-empty queue into this
-- process's working list, in one step, so a job is never only in memory.
-- KEYS[1..n-1] queue lists in the order to try; KEYS[n] the working list.
-- Returns {index of the queue (1-based), payload} or nil when all are empty.
local working = KEYS[#KEYS]
for i = 1, #KEYS - 1 do
  local job = redis.call('LMOVE', KEYS[i], working, 'RIGHT', 'LEFT')
  if job then
    return {i, job}
  end
end
return nil
