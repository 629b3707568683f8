-- Starts a campaign's release again after Redis lost it (a master promoted before its
-- replica had synced, or restarted without persistence): PostgreSQL still has the
-- campaign, and which of its packets are won (shake) or created (send).
-- KEYS[1] = 'TAG:c:ID', the campaign's hash in one of its K release tags (release.lua).
-- ARGV: the campaign's id, packets, rate (a second), start (ms), K, this tag's t, then
-- the indexes of its packets already done that are this tag's (t mod K), ascending.
-- Returns the number of packets put back in line, or -1 when the release was there
-- (nothing lost, or another host restored it first).
--
-- Every packet of this tag due by now counts as released ('next' = due); those due and
-- not done go back, first in line, as a dead host's would: some may still sit in a live
-- host's pool (Redis forgot it holds them), and a packet given twice is won once
-- (hb_wins). Costs one pass over the tag's packets due, once per loss. Each tag is
-- restored on its own: a master lost takes only the tags whose slots it held.
local k = KEYS[1]
if redis.call('EXISTS', k) == 1 then return -1 end
local tag = string.match(k, '^(.*):c:%d+$')
local c, packets, rate, start = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tags, t = tonumber(ARGV[5]), tonumber(ARGV[6])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
-- This tag's packets, and those due now, as release.lua counts them.
local function below(n)
  if n <= t then return 0 end
  return math.floor((n - t + tags - 1) / tags)
end
local mine = below(packets)
local due = math.min(mine, below(math.max(0, math.floor((now - start) * rate / 1000))))
local back = tag .. ':back:' .. c
redis.call('DEL', back)
local done, d, n = 7, tonumber(ARGV[7]), 0
for j = 0, due - 1 do
  local i = t + j * tags
  while d ~= nil and d < i do
    done = done + 1
    d = tonumber(ARGV[done])
  end
  if d ~= i then
    redis.call('RPUSH', back, i)
    n = n + 1
  end
end
redis.call('HSET', k, 'packets', mine, 'rate', rate, 'start', start, 'next', due,
           'returned', n)
if tags > 1 then redis.call('HSET', k, 'tags', tags, 'tag', t) end
if due < mine or n > 0 then redis.call('SADD', tag .. ':running', c) end
return n
