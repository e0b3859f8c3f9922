-- release: give up the caller's hold on its record. Without a retention,
-- delete it so that a retry runs the operation (idem.ApplyRelease); with
-- one, mark it unknown for that long, since the operation may have run
-- (idem.ApplyMarkUnknown). A completed record is never released.
--
-- KEYS[1]  record key
-- ARGV[1]  attempt token
-- ARGV[2]  absent to delete; or the retention of the unknown record,
--          milliseconds
--
-- Returns 1 when deleted or marked (or already unknown), 0 when no record
-- exists, -1 when the token does not hold the record or it completed.
-- Publishes on the channel KEYS[1] when a duplicate waits (see watch.lua).

local cur, answer = held(KEYS[1], ARGV[1], 'w')
if not cur then
  return answer
end
if not ARGV[2] then
  redis.call('DEL', KEYS[1])
elseif cur[1] == 'u' then
  return 1
else
  redis.call('HSET', KEYS[1], 's', 'u')
  redis.call('HDEL', KEYS[1], 'l', 'w')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if cur[3] then
  redis.call('PUBLISH', KEYS[1], ARGV[2] and 'u' or 'r')
end
return 1
