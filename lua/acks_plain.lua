-- uses: take_out
-- Finish several successful jobs that hold no lock and belong to no batch:
-- each leaves the working list (lib/take_out.lua). acks.lua without the
-- groups of 4: a plain job pays for no lock or batch field.
-- KEYS[1] working list. ARGV the payloads as fetched, oldest first.
-- Returns {how many of the jobs were still in the working list, 0, ""}, as
-- acks.lua does.
local take, removed = take_out(KEYS[1], ARGV, 1), 0
for i = 1, #ARGV do
  if take(ARGV[i]) then
    removed = removed + 1
  end
end
return { removed, 0, '' }
