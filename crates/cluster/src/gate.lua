-- The gate in front of PostgreSQL for opening a share of packet KEYS[1] = '{pk:ID}'
-- (its recipients in '{pk:ID}:r', who got through in '{pk:ID}:o').
-- ARGV[1] = the user. Returns 'pass' (PostgreSQL decides), or the refusal it can give
-- without PostgreSQL: 'not-a-recipient', 'empty'. No gate (expired, or lost in a
-- failover) is a pass: PostgreSQL holds every rule; the gate only spares it work.
local k = KEYS[1]
local left = redis.call('HGET', k, 'left')
if not left then return 'pass' end
local user = ARGV[1]
if redis.call('SISMEMBER', k .. ':r', user) == 0 then return 'not-a-recipient' end
if redis.call('SISMEMBER', k .. ':o', user) == 1 then return 'pass' end
if tonumber(left) <= 0 then return 'empty' end
redis.call('HINCRBY', k, 'left', -1)
redis.call('SADD', k .. ':o', user)
return 'pass'
