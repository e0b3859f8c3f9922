-- reserve: claim a record for one attempt, or report what holds it.
-- Mirrors idem.ApplyReserve; the store contract suite holds both to it.
--
-- KEYS[1]  record key
-- KEYS[2]  the attempt token's cancel marker (CancelledKey: the record's
--          hash tag, so one Cluster slot)
-- ARGV[1]  request fingerprint (32 raw bytes)
-- ARGV[2]  attempt token (16 raw bytes)
-- ARGV[3]  lease, milliseconds
-- ARGV[4]  retention, milliseconds
-- ARGV[5]  on lease expiry: "u" (mark unknown) or "r" (re-execute)
-- ARGV[6]  "" (or absent) to reserve; or the region a hand-over gives the key to
--          (idem.Reservation.HandOverTo): where a reservation would be
--          made, a moved tombstone naming it is left instead
--
-- Returns {outcome, attempt, created_ms} where outcome is one of
-- "reserved", "mismatch", "in_flight", "unknown", "damaged" when the key
-- holds a value no script writes (record.lib), or "cancelled" when the
-- attempt cancelled this reservation before it arrived (cancel.lua: it
-- then changes nothing); or, for a completed
-- record, {"completed", attempt, created_ms, record} where record is the
-- whole stored string (the caller decodes the response after its head);
-- or {"moved", 0, 0, home} for a key a hand-over gave to another region,
-- {"handed_over", 0, created_ms, home} for a hand-over that left (or
-- found) its tombstone.
-- Lease expiry is judged by the server's TIME, never the caller's clock.
--
-- An in-flight or unknown record is a hash: s state (i in flight, u
-- unknown), f fingerprint, t token, l lease end (ms), a attempts, c created
-- (ms), w set while a duplicate waits for the record to settle (watch.lua).
-- A moved tombstone is a hash: s m, h the region the key moved to, c
-- created (ms).
-- A completed record is a string (complete.lua; record.lib and codec.go
-- give its layouts); one cut or grown is damaged before anything else of it
-- is read, and a replay counts its attempt in the record's own layout
-- (completed_reply).
-- Turning a record unknown or taking it over publishes on KEYS[1] for
-- those waiters.

local key = KEYS[1]
if redis.call('EXISTS', KEYS[2]) == 1 then
  -- Its attempt gave up on it and cancelled it: it arrived too late.
  return {'cancelled', 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local kind = redis.call('TYPE', key)['ok']
if kind == 'string' then
  return completed_reply(key, ARGV[1], true)
end

if kind ~= 'hash' and kind ~= 'none' then
  return {'damaged', 0, 0}
end

local cur = redis.call('HMGET', key, 's', 'f', 't', 'l', 'a', 'c', 'w', 'h')
local state = cur[1]
if kind == 'hash' and damaged_hash(state, cur[2]) then
  return {'damaged', 0, 0}
end
local handover = ARGV[6] or ''  -- absent: a caller that never hands over (the load tool's floor)
if state == 'm' then
  if handover ~= '' and handover == cur[8] then
    return {'handed_over', 0, tonumber(cur[6]), cur[8]}
  end
  return {'moved', 0, 0, cur[8]}
end
local function tombstone()
  redis.call('DEL', key)
  redis.call('HSET', key, 's', 'm', 'h', handover, 'c', now)
  redis.call('PEXPIRE', key, ARGV[4])
  return {'handed_over', 0, now, handover}
end
if not state then
  if handover ~= '' then
    return tombstone()
  end
  redis.call('HSET', key, 's', 'i', 'f', ARGV[1], 't', ARGV[2],
    'l', now + tonumber(ARGV[3]), 'a', 1, 'c', now)
  redis.call('PEXPIRE', key, ARGV[4])
  return {'reserved', 1, now}
end

if cur[2] ~= ARGV[1] then
  return {'mismatch', 0, 0}
end
local created = tonumber(cur[6])
if state == 'i' and cur[3] == ARGV[2] then
  -- The same attempt asking again: its first reply was lost.
  return {'reserved', tonumber(cur[5]), created}
end

local attempt = redis.call('HINCRBY', key, 'a', 1)
if state == 'u' then
  return {'unknown', attempt, created}
end
if now < tonumber(cur[4]) then
  return {'in_flight', attempt, created}
end
if cur[7] then
  redis.call('HDEL', key, 'w')
  redis.call('PUBLISH', key, 'x')
end
if ARGV[5] == 'r' then
  if handover ~= '' then
    return tombstone()
  end
  redis.call('HSET', key, 't', ARGV[2], 'l', now + tonumber(ARGV[3]))
  redis.call('PEXPIRE', key, ARGV[4])
  return {'reserved', attempt, created}
end
-- The holder stopped renewing its lease: the effect is unknown.
redis.call('HSET', key, 's', 'u')
redis.call('HDEL', key, 'l')
redis.call('PEXPIRE', key, ARGV[4])
return {'unknown', attempt, created}
