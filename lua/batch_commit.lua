-- uses: batch_done
-- One handle of batch bid is done adding jobs. When none holds it open any
-- more, what is due fires now: an empty batch completes and succeeds, and
-- jobs that all finished before the commit fire their callbacks here.
-- KEYS[1] "batch:BID", and declared for what firing touches: KEYS[2]
-- "batch:BID:jids", KEYS[3] "batch:BID:failures", KEYS[4] "batches:open",
-- KEYS[5] "queues" (lib/batch_done.lua names them itself; a parent's keys
-- and the callbacks' queues, read from the batch, cannot be declared:
-- doc/internals.md). ARGV[1] bid. Returns batch_done's flags.
local key = KEYS[1]
if redis.call('EXISTS', key) == 0 then
  return redis.error_reply('NOTFOUND no batch ' .. ARGV[1])
end
if batch_num(key, 'open') > 0 then
  redis.call('HINCRBY', key, 'open', -1)
end
return batch_check(ARGV[1])
