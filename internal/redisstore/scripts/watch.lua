-- watch: mark an in-flight record as awaited, so that the script that
-- settles it publishes on the channel named like the record's key, and
-- report its state. The caller subscribes to that channel before calling
-- this, so no settlement can fall between the check and the subscription.
--
-- KEYS[1]  record key
--
-- Returns the state: "i" (in flight, now marked), "c", "u", or "" when
-- there is no record.

if redis.call('TYPE', KEYS[1])['ok'] == 'string' then
  return 'c' -- completed
end
local s = redis.call('HGET', KEYS[1], 's')
if not s then
  return ''
end
if s == 'i' then
  redis.call('HSET', KEYS[1], 'w', '1')
end
return s
