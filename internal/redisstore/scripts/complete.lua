-- complete: store the operation's response in the caller's record.
-- Mirrors idem.ApplyComplete: allowed from in flight, and from unknown when
-- the caller's own lease ran out (the upstream did answer after all);
-- repeating it on the completed record is a no-op.
--
-- KEYS[1]  record key
-- ARGV[1]  attempt token
-- ARGV[2]  retention, milliseconds
-- ARGV[3]  response head: status, flags, headers (codec.go encodeResponseHead)
-- ARGV[4]  response body
--
-- Returns 1 when stored (or already stored by this token), 0 when no record
-- exists, -1 when the token does not hold the record.
-- The in-flight hash becomes the completed record's string in the compact
-- layout (reserve.lua and codec.go): "d", fingerprint, token, attempts
-- (4 bytes big-endian), created ms (6 bytes big-endian, packed as its high
-- 16 and low 32 bits: the struct library's integer sizes are powers of
-- two), response head, body. That keeps a record with a 1 KiB body near
-- 1.3 KiB of Redis memory where a hashtable would take twice that. The
-- token is at offset 33 in both layouts, so a record written in the
-- decimal layout before ("c") is recognised as this token's all the same.
-- Publishes on the channel KEYS[1] when a duplicate waits (field w; see
-- watch.lua).

local key = KEYS[1]
if redis.call('TYPE', key)['ok'] == 'string' then
  if redis.call('GETRANGE', key, 33, 48) == ARGV[1] then
    return 1
  end
  return -1
end
local cur = redis.call('HMGET', key, 's', 't', 'w', 'f', 'a', 'c')
if not cur[1] then
  return 0
end
if cur[2] ~= ARGV[1] then
  return -1
end
local attempts = math.min(tonumber(cur[5]), 4294967295)
local created = tonumber(cur[6])
redis.call('SET', key, 'd' .. cur[4] .. cur[2] ..
  struct.pack('>I4I2I4', attempts, math.floor(created / 4294967296), created % 4294967296) ..
  ARGV[3] .. ARGV[4], 'PX', ARGV[2])
if cur[3] then
  redis.call('PUBLISH', key, 'c')
end
return 1
