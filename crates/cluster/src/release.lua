-- Releases the packets of every running campaign at its exact rate, across all hosts.
-- KEYS[1] = 'TAG:hosts', TAG one of the release's hash tags ('{rel}', '{rel.1}', …:
-- release.rs's release_tag): every key used is under that tag, one slot. A campaign
-- released over K tags has a hash in each; tag t releases its indices t, t+K, t+2K, …
-- (the hash's 'tags' and 'tag': K and t, absent for K = 1, the release before tags).
-- ARGV: this host's name, how long a silent host counts as alive (ms), the number of the
-- last batch this host received (0 at first), the users logged in on this host, then the
-- packets ('campaign:index') this host gave whose removal from its held set failed (a
-- master frozen or failing over at that instant): removed now, so none stays held for
-- ever, to be given back — and given twice — when the host dies.
-- Returns {now_ms, batch, fresh, 'campaign:index', ...}: the packets now this host's to
-- give; fresh is 1 when this host was not among the hosts alive (its first call, a host
-- found dead coming back, or Redis having lost this tag's keys: restore.lua's cue).
--
-- A batch is given until the host says it has it: a reply lost on the way (a client
-- timeout while the cluster fails over, after the script ran) would otherwise leave its
-- packets held by a live host that never heard of them, never won and never returned.
-- So a host that has not received the last batch gets its packets again (those it
-- still holds), with whatever is new, under the next number.
--
-- The clock is Redis's own (TIME), so hosts' clocks do not matter. A host takes at most
-- its fair part of all that has come due less what it took before, so the packets
-- alternate between hosts however their calls interleave; when a host dies the others'
-- parts grow and they catch up. Its part is its share of the users logged in on hosts
-- alive (rounded up; ÷ hosts alive while nobody is logged in): a host whose clients all
-- went elsewhere (it was killed and started again, they reconnected through nginx)
-- takes nothing, and gives back what it holds, instead of keeping half the packets
-- where nobody shakes. A host silent for longer than ARGV[2] is dead: the packets it
-- held and had not given go back, first in line.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local host = ARGV[1]
local hosts = KEYS[1]
local tag = string.sub(hosts, 1, -7)
local fresh = redis.call('ZADD', hosts, now, host)
if #ARGV > 4 then
  redis.call('SREM', tag .. ':held:' .. host, unpack(ARGV, 5))
end
-- The packets host h holds go back, first in line for whoever takes next.
local function give_back(h)
  local held = tag .. ':held:' .. h
  for _, p in ipairs(redis.call('SMEMBERS', held)) do
    local c, i = string.match(p, '^(%d+):(%d+)$')
    redis.call('RPUSH', tag .. ':back:' .. c, i)
    redis.call('SADD', tag .. ':running', c)
    redis.call('HINCRBY', tag .. ':c:' .. c, 'returned', 1)
  end
  redis.call('DEL', held)
end
local dead = redis.call('ZRANGEBYSCORE', hosts, '-inf', '(' .. (now - tonumber(ARGV[2])))
local users_key = tag .. ':users'
local users = tonumber(ARGV[4])
redis.call('HSET', users_key, host, users)
for _, h in ipairs(dead) do
  give_back(h)
  redis.call('ZREM', hosts, h)
  redis.call('HDEL', users_key, h)
end
local alive = math.max(1, redis.call('ZCARD', hosts))
local all_users = 0
for _, n in ipairs(redis.call('HMGET', users_key, unpack(redis.call('ZRANGE', hosts, 0, -1)))) do
  all_users = all_users + (tonumber(n) or 0)
end
-- This host's share of what comes due.
local share = 1 / alive
if all_users > 0 then share = users / all_users end
local mine = tag .. ':held:' .. host
local seqkey = tag .. ':batch:' .. host
local lastkey = tag .. ':last:' .. host
local received = tonumber(ARGV[3])
-- A host that has received nothing yet is a process just started — perhaps under the
-- name of one killed a moment ago, before any host found it dead (its heartbeat above
-- has just made it alive again): it cannot know what its name held, so that goes back.
-- So does what a host holds while nobody is logged in on it and others have users.
if received == 0 or (users == 0 and all_users > 0) then
  give_back(host)
end
if received == 0 then
  redis.call('DEL', lastkey)
  redis.call('SET', seqkey, 0)
end
local batch = tonumber(redis.call('GET', seqkey) or '0')
local out = {now, 0, fresh}
if received < batch then
  for _, p in ipairs(redis.call('LRANGE', lastkey, 0, -1)) do
    if redis.call('SISMEMBER', mine, p) == 1 then table.insert(out, p) end
  end
end
-- How many of this tag's packets are due: of the campaign's D due in all (its rate over
-- the time since its start), those of indices t, t+K, … below D, ceil((D - t) / K).
-- Summed over the K tags that is D at every instant; capped at this tag's packets (the
-- indices below the campaign's that are t mod K), as D is at the campaign's.
local function due_here(start, rate, packets, tags, t)
  local all = math.floor((now - start) * rate / 1000)
  if all <= t then return 0 end
  return math.min(packets, math.floor((all - t + tags - 1) / tags))
end
for _, c in ipairs(redis.call('SMEMBERS', tag .. ':running')) do
  local k = tag .. ':c:' .. c
  local v = redis.call('HMGET', k, 'packets', 'rate', 'start', 'next', 'returned', 't:' .. host,
                       'tags', 'tag')
  local packets, rate, start, nxt = tonumber(v[1]), tonumber(v[2]), tonumber(v[3]), tonumber(v[4])
  local returned, taken = tonumber(v[5] or '0'), tonumber(v[6] or '0')
  local tags, t = tonumber(v[7] or '1'), tonumber(v[8] or '0')
  if packets == nil then
    redis.call('SREM', tag .. ':running', c)
  else
    -- 'next' and 'packets' count this tag's packets; the index of its n-th is t + n K.
    local due = due_here(start, rate, packets, tags, t)
    local back = tag .. ':back:' .. c
    -- This host's fair part of everything due so far, less what it already took.
    local take = math.min(math.ceil((due + returned) * share) - taken,
                          (due - nxt) + redis.call('LLEN', back))
    if take > 0 then redis.call('HINCRBY', k, 't:' .. host, take) end
    while take > 0 do
      local i = redis.call('LPOP', back)
      if not i then break end
      table.insert(out, c .. ':' .. i)
      redis.call('SADD', mine, c .. ':' .. i)
      take = take - 1
    end
    while take > 0 and nxt < due do
      local p = c .. ':' .. (t + nxt * tags)
      table.insert(out, p)
      redis.call('SADD', mine, p)
      nxt = nxt + 1
      take = take - 1
    end
    redis.call('HSET', k, 'next', nxt)
    if nxt >= packets then redis.call('HSETNX', k, 'all', now) end
    if nxt >= packets and redis.call('LLEN', back) == 0 then
      redis.call('SREM', tag .. ':running', c)
    end
  end
end
if #out > 3 then
  batch = math.max(batch, received) + 1
  redis.call('DEL', lastkey)
  for n = 4, #out do redis.call('RPUSH', lastkey, out[n]) end
  redis.call('SET', seqkey, batch)
elseif received ~= batch then
  -- Nothing to give again (or this host is ahead: Redis lost writes in a failover).
  batch = received
  redis.call('SET', seqkey, batch)
end
out[2] = batch
return out
