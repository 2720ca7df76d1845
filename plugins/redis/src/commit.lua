-- One commit of one table: the fence, the replay check, the data and the
-- position, in one script, so Redis runs it as one atomic step.
--
-- KEYS[1]   the table's position hash (fields `epoch`, `position`)
-- KEYS[2..] the data keys the changes touch
-- ARGV[1]   the commit's epoch, decimal without leading zeros
-- ARGV[2]   the commit's position, lowercase hex
-- ARGV[3]   the position of the first change staged, lowercase hex; empty
--           when no change is
-- ARGV[4]   how many changes follow; each is
--           kind ("hash" | "del" | "xadd"), index into KEYS, field count n,
--           then n field/value pairs
--
-- Replies: {"applied"}, {"replayed", stored position}, {"fenced", stored
-- epoch}, {"inside", stored position, first staged position},
-- {"wrongtype", key, its type}, {"corrupt", key}.
--
-- Redis does not undo a script's writes when a command fails half way, so
-- everything that could fail is checked before the first write.

-- a <= b, comparing bytes (Lua's < follows the server's locale).
local function bytes_le(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a <= #b
end

-- a < b for decimal strings without leading zeros, of any length (Lua
-- numbers are doubles: an epoch past 2^53 would lose digits).
local function epoch_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a ~= b and bytes_le(a, b)
end

local control = KEYS[1]
local epoch, position = ARGV[1], ARGV[2]

local control_type = redis.call('TYPE', control)['ok']
if control_type ~= 'none' and control_type ~= 'hash' then
  return {'wrongtype', control, control_type}
end
local stored = redis.call('HMGET', control, 'epoch', 'position')
local stored_epoch, stored_position = stored[1], stored[2]
if stored_epoch or stored_position then
  if not stored_epoch or not stored_position
      or not (stored_epoch == '0' or string.match(stored_epoch, '^[1-9]%d*$'))
      or not string.match(stored_position, '^[0-9a-f]*$') or #stored_position % 2 ~= 0 then
    return {'corrupt', control}
  end
  if epoch_lt(epoch, stored_epoch) then
    return {'fenced', stored_epoch}
  end
  -- Positions only grow, and a batch with changes stands past the one
  -- before it: a position at or before the stored one was applied already
  -- (its reply was lost, or the host replays). Apply nothing again, but a
  -- newer epoch still takes the table over.
  if bytes_le(position, stored_position) then
    if epoch_lt(stored_epoch, epoch) then
      redis.call('HSET', control, 'epoch', epoch)
    end
    return {'replayed', stored_position}
  end
  -- A stored position at or past the first staged change, short of this
  -- commit's: another host committed part of these changes after this one
  -- read where the table stood (a commit frozen until the pipeline moved).
  -- Applying them again would hold them twice.
  local low = ARGV[3]
  if low ~= '' and bytes_le(low, stored_position) then
    return {'inside', stored_position, low}
  end
end

-- Every data key must be free or of the type we write.
local count = tonumber(ARGV[4])
local wanted = {}
local at = 5
for _ = 1, count do
  local kind, key, fields = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  if kind == 'xadd' then wanted[key] = 'stream' else wanted[key] = 'hash' end
  at = at + 3 + 2 * fields
end
for key, want in pairs(wanted) do
  local found = redis.call('TYPE', KEYS[key])['ok']
  if found ~= 'none' and found ~= want then
    return {'wrongtype', KEYS[key], found}
  end
end

-- Lua's unpack holds a few thousand values: HSET goes in slices.
local slice = 1000
at = 5
for _ = 1, count do
  local kind, key, fields = ARGV[at], KEYS[tonumber(ARGV[at + 1])], tonumber(ARGV[at + 2])
  local first, last = at + 3, at + 2 + 2 * fields
  if kind == 'del' then
    redis.call('DEL', key)
  elseif kind == 'hash' then
    redis.call('DEL', key)
    for from = first, last, 2 * slice do
      redis.call('HSET', key, unpack(ARGV, from, math.min(from + 2 * slice - 1, last)))
    end
  else
    redis.call('XADD', key, '*', unpack(ARGV, first, last))
  end
  at = last + 1
end

redis.call('HSET', control, 'epoch', epoch, 'position', position)
return {'applied'}
