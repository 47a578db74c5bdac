-- uses: take_out
-- Finish several successful jobs that hold no lock and belong to no batch:
-- each leaves the working list (lib/take_out.lua). acks.lua without the
-- kinds and the jid and bid of each: a plain job pays for no lock or
-- batch field.
-- KEYS[1] working list. ARGV the payloads as fetched, oldest first.
-- Returns {how many of the jobs were still in the working list, 0, ""}, as
-- acks.lua does.
local working, argv, removed = KEYS[1], ARGV, 0
local take, read = take_out(working, argv, 1)
if read then
  for i = 1, #argv do
    if take(argv[i]) then
      removed = removed + 1
    end
  end
else
  -- take's LREM itself, without a Lua call a job.
  for i = 1, #argv do
    removed = removed + redis.call('LREM', working, '-1', argv[i])
  end
end
return { removed, 0, '' }
