-- wake_waiters(locked): after a hold on the lock hash locked ("<key>:LOCKED")
-- was dropped, wakes the jobs waiting for it (lock_timeout): "<key>:WAITING"
-- is their line, "<key>:WAKE" the list they block on between tries (BLPOP);
-- the caller declares both in KEYS. One token a waiter, at most 64, and
-- never more tokens in the list than waiters, so a waiter that was not
-- blocked at the release finds one token, not one per release. Every
-- waiter woken tries again; the first in line takes the lock, the others
-- block again. A waiter not woken (more than 64, a crashed holder's lease
-- ending) finds out at its next try. The wake is best effort: a key of
-- another type under either name fails it, never the script that released
-- (which has written already).
local function wake_line(waiting, wake)
  local n = redis.call('ZCARD', waiting)
  if n == 0 then
    return
  end
  if n > 64 then
    n = 64
  end
  local tokens = {}
  for i = 1, n do
    tokens[i] = '1'
  end
  redis.call('LPUSH', wake, unpack(tokens))
  redis.call('LTRIM', wake, 0, n - 1)
  redis.call('PEXPIRE', wake, 5000)
end

local function wake_waiters(locked)
  if string.sub(locked, -7) ~= ':LOCKED' then
    return
  end
  local base = string.sub(locked, 1, -8)
  pcall(wake_line, base .. ':WAITING', base .. ':WAKE')
end
