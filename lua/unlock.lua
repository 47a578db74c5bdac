-- uses: drop_lock
-- Release one jid's hold on a uniqueness lock (v9's unlock).
-- KEYS[1] the locked hash, KEYS[2] the digests zset.
-- ARGV[1] jid, ARGV[2] lock type, or "force".
-- Returns 1 when released (or nothing was left to release), 0 when other
-- jids hold it (lib/drop_lock.lua).
return drop_lock(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
