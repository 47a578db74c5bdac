-- uses: fits
-- Enqueues the due ticks of one periodic schedule, each at most once in the
-- whole fleet: every process with the schedule calls this for the ticks it
-- sees due, and the record of the last tick decides. Ticks come in
-- ascending order; a tick not after the recorded one was handled already
-- (enqueued, or let go as missed) and is left alone. The record expires
-- after a bounded time (ARGV[3]), longer than the gap between two ticks.
-- KEYS[1] the schedule's record (hash: last = tick time in epoch seconds,
--         sig = its expression's signature), KEYS[2] queue list,
-- KEYS[3] "queues" set.
-- ARGV[1] sig, ARGV[2] queue name, ARGV[3] record TTL in seconds, then
-- pairs: tick time, payload, or '#N' for N missed ticks let go (up to that
-- tick time).
-- Returns {enqueued, let go, last tick recorded}, or {-1, 0, 0} when the
-- queue key holds another type than a list (nothing recorded).
if not fits(KEYS[2], 'list') then
  return {-1, 0, 0}
end
local last = tonumber(redis.call('HGET', KEYS[1], 'last') or '-1')
local pushed, skipped, newest = 0, 0, last
for i = 4, #ARGV, 2 do
  local tick = tonumber(ARGV[i])
  if tick > newest then
    newest = tick
    if string.sub(ARGV[i + 1], 1, 1) == '#' then
      skipped = skipped + tonumber(string.sub(ARGV[i + 1], 2))
    else
      redis.call('LPUSH', KEYS[2], ARGV[i + 1])
      pushed = pushed + 1
    end
  end
end
if newest > last then
  redis.call('HSET', KEYS[1], 'last', string.format('%d', newest), 'sig', ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  if pushed > 0 then
    redis.call('SADD', KEYS[3], ARGV[2])
  end
end
return {pushed, skipped, newest}
