-- Starts a campaign's release again after Redis lost it (a master promoted before its
-- replica had synced, or restarted without persistence): PostgreSQL still has the
-- campaign, and which of its packets are won (shake) or created (send).
-- KEYS[1] = '{rel}:c:ID'. ARGV: the campaign's id, packets, rate (a second), start (ms),
-- then the indexes of its packets already done, ascending.
-- Returns the number of packets put back in line, or -1 when the release was there
-- (nothing lost, or another host restored it first).
--
-- Every packet due by now counts as released ('next' = due); those due and not done go
-- back, first in line, as a dead host's would: some may still sit in a live host's pool
-- (Redis forgot it holds them), and a packet given twice is won once (hb_wins). Costs
-- one pass over the packets due, once per loss.
local k = KEYS[1]
if redis.call('EXISTS', k) == 1 then return -1 end
local c, packets, rate, start = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = math.min(packets, math.max(0, math.floor((now - start) * rate / 1000)))
local back = '{rel}:back:' .. c
redis.call('DEL', back)
local done, d, n = 5, tonumber(ARGV[5]), 0
for i = 0, due - 1 do
  while d ~= nil and d < i do
    done = done + 1
    d = tonumber(ARGV[done])
  end
  if d ~= i then
    redis.call('RPUSH', back, i)
    n = n + 1
  end
end
redis.call('HSET', k, 'packets', packets, 'rate', rate, 'start', start, 'next', due,
           'returned', n)
if due < packets or n > 0 then redis.call('SADD', '{rel}:running', c) end
return n
