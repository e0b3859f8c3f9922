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
-- The in-flight hash becomes the completed record's string in the sized
-- layout (completed_record, record.lib), which states its own length. That
-- keeps a record with a 1 KiB body near 1.3 KiB of Redis memory where a
-- hashtable would take twice that. The token is at offset 33 in every
-- layout (GETRANGE's end is inclusive, src/t_string.c getrangeCommand),
-- so a record written in an earlier layout ("d", "c") is recognised as
-- this token's all the same.
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
redis.call('SET', key, completed_record(cur[4], cur[2], cur[5], cur[6], ARGV[3], ARGV[4]), 'PX', ARGV[2])
if cur[3] then
  redis.call('PUBLISH', key, 'c')
end
return 1
