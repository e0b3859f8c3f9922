#!lua flags=no-writes
-- peek: what reserve would answer for a key that exists, without writing.
-- Used only when Redis refuses writes (maxmemory reached with noeviction):
-- a known operation is still answered, a new one is refused by the caller.
--
-- KEYS[1]  record key
-- ARGV[1]  request fingerprint (32 raw bytes)
--
-- Returns {"absent", 0, 0}, or what reserve.lua returns for a record that
-- exists, with the attempt number it would have counted (not stored).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'string' then
  return completed_reply(KEYS[1], ARGV[1], false)
end
if kind ~= 'hash' and kind ~= 'none' then
  return {'damaged', 0, 0}
end
local cur = redis.call('HMGET', KEYS[1], 's', 'f', 'l', 'a', 'c')
local state = cur[1]
if kind == 'hash' and damaged_hash(state, cur[2]) then
  return {'damaged', 0, 0}
end
if not state then
  return {'absent', 0, 0}
end
if state == 'm' then
  return {'moved', 0, 0, redis.call('HGET', KEYS[1], 'h')}
end
if cur[2] ~= ARGV[1] then
  return {'mismatch', 0, 0}
end
local attempt = tonumber(cur[4]) + 1
local created = tonumber(cur[5])
if state == 'u' or now >= tonumber(cur[3]) then
  return {'unknown', attempt, created}
end
return {'in_flight', attempt, created}
