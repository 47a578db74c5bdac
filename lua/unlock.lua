-- uses: drop_lock
-- uses: wake_waiters
-- Release one jid's hold on a uniqueness lock (v9's unlock).
-- KEYS[1] the locked hash, KEYS[2] the digests zset, KEYS[3] and KEYS[4] its
-- "<key>:WAITING" and "<key>:WAKE" (lib/wake_waiters.lua).
-- ARGV[1] jid, ARGV[2] lock type, or "force".
-- Returns 1 when released (or nothing was left to release), 0 when other
-- jids hold it (lib/drop_lock.lua); with 1, the lock's waiters are woken.
local released = drop_lock(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if released == 1 then
  wake_waiters(KEYS[1])
end
return released
