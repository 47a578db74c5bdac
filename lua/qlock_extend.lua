-- uses: holds_qlock
-- Lengthen a queued lock's lease, only for its holder (the gem's extend
-- checks nobody and turns a key without expiry into ms - 1).
-- KEYS[1] rql:lock:NAME   ARGV[1] acq_id   ARGV[2] fencing token ("" = any)
-- ARGV[3] ms   ARGV[4] "add" (PTTL + ms, as the gem) or "set" (PTTL = ms)
-- Returns the new PTTL in ms, or 0 when the caller no longer holds the lock.
if not holds_qlock(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
local ms = tonumber(ARGV[3])
if ARGV[4] == 'add' then
  local left = redis.call('PTTL', KEYS[1])
  if left > 0 then ms = ms + left end
end
redis.call('PEXPIRE', KEYS[1], ms)
return ms
