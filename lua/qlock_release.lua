-- uses: holds_qlock
-- Release a queued lock only if the caller still holds it: after its ttl
-- ran out the key may belong to the next holder, whom a plain DEL (as the
-- gem does) would rob.
-- KEYS[1] rql:lock:NAME   ARGV[1] acq_id   ARGV[2] fencing token ("" = any)
-- Returns 1 when released, 0 when the caller no longer held it.
if not holds_qlock(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
