//! The Lua scripts of the Redis backend: each is one atomic step on a
//! stream's keys (and the global indexes it must keep in step), so that no
//! reader ever sees half a write. Scripts only move cursors and times
//! forward, and write back the caller's own strings for numbers they compare
//! (Lua numbers are doubles, exact below 2^53).
//!
//! A stream is one value (`packed.rs`) that a script unpacks with
//! `cmsgpack`, changes and packs back whole. A stream the previous layout
//! wrote (a metadata hash, its entries in its log) is moved into one the
//! first time a script writes to it (`load` below); until then it is read
//! as it is.
//!
//! Every write other instances must learn about also adds a line to the
//! stream's shard of the feed (`P:feed:<n>`, a capped Redis Stream:
//! `shards.rs`) in the same script: what changed and which instance changed
//! it; one that changes a live stream another instance owns goes to the
//! feed every instance reads (`P:feed`), since an owner reads no shard for
//! its own streams. Leases are timed by Redis' own clock
//! (`TIME`), so instances whose clocks disagree still agree on who is dead.

use redis::Script;

use super::packed::{INLINE_BYTES, INLINE_ENTRIES};
use super::shards::{FEED_LENGTH, SHARD_LENGTH};

pub(super) struct Scripts {
    pub create: Script,
    pub append: Script,
    pub change: Script,
    pub delete: Script,
    pub task: Script,
    pub renew: Script,
    pub claim: Script,
}

/// How long one window of the retention index is, in ms (see `retain`).
pub(super) const RETENTION_WINDOW: u64 = 1_000;

/// Helpers every script may use. Keys computed here are not declared: on
/// one server any key goes; on a cluster every key of the prefix is in the
/// declared keys' slot (`cluster.rs`).
const PRELUDE: &str = r#"
local function owned(prefix, instance) return prefix .. ':owned:' .. instance end
local function feed(key, ...)
  redis.call('XADD', key, 'MAXLEN', '~', SHARD_LENGTH, '*', ...)
end
-- A stream's change goes to its shard (`shard`), read by the instances
-- following it from elsewhere, unless `instance` changes a live stream
-- another instance owns: the owner reads no shard for the streams it
-- writes, so it hears of that on the feed every instance reads.
local function tell(shard, prefix, owner, instance, ...)
  if owner and owner ~= instance then
    redis.call('XADD', prefix .. ':feed', 'MAXLEN', '~', FEED_LENGTH, '*', 'i', instance, ...)
  else
    feed(shard, 'i', instance, ...)
  end
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Extends an instance's lease to now + lease_ms (never shortens it); a
-- retired instance (score 0) stays retired. Returns the new expiry, or -1.
local function renew_lease(instances, instance, lease_ms)
  local held = redis.call('ZSCORE', instances, instance)
  if held == '0' then return -1 end
  local until_ms = now_ms() + tonumber(lease_ms)
  if not held or until_ms > tonumber(held) then
    redis.call('ZADD', instances, until_ms, instance)
  end
  return until_ms
end
-- A number as the integer text Redis takes (Lua numbers are doubles).
local function int(n) return string.format('%.0f', n) end
local function hex(raw)
  return (string.gsub(raw, '.', function(c) return string.format('%02x', string.byte(c)) end))
end
-- The start of a stream's (session's, task's) keys: `{P:<id>}`, or on a
-- cluster, where the prefix comes in braces, `{P}:<id>` (`cluster.rs`).
local function tag(prefix, id)
  if string.sub(prefix, 1, 1) == '{' then return prefix .. ':' .. id end
  return '{' .. prefix .. ':' .. id .. '}'
end

-- A stream's table (`packed.rs`) written back, keeping the key's TTL.
local function save(key, t) redis.call('SET', key, cmsgpack.pack(t), 'KEEPTTL') end

-- The previous layout's metadata hash fields, by what they become.
local TEXTS = {record = 'J', up_event = 'u', owner = 'w', task = 'T'}
local NUMBERS = {finished_ms = 'f', acked = 'a', touched_ms = 'h', abandon_after_ms = 'A',
  abandon_at_ms = 'z', last_request = 'q', up_seq = 'v', entries = 'n', bytes = 'b'}
local STATUS = {completed = 1, failed = 2, cancelled = 3}
local OUTCOME = {result = 0, error = 1}

-- Moves a stream of the previous layout into one value (its record kept
-- as `J`, its entries left in its log), with the hash's TTL; nil when
-- there is no such hash either.
local function migrate(key, meta)
  local flat = redis.call('HGETALL', meta)
  if #flat == 0 then return nil end
  local t = {l = 1}
  for i = 1, #flat, 2 do
    local field, value = flat[i], flat[i + 1]
    if TEXTS[field] then t[TEXTS[field]] = value
    elseif NUMBERS[field] then t[NUMBERS[field]] = tonumber(value)
    elseif field == 'status' then t.s = STATUS[value]
    elseif field == 'outcome' then t.o = OUTCOME[value]
    elseif field == 'coalesced' and value == '1' then t.c = 1
    end
  end
  local ttl = redis.call('PTTL', meta)
  redis.call('DEL', meta)
  redis.call('SET', key, cmsgpack.pack(t))
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
  return t
end

-- The stream at `key` (its previous layout's hash at `meta`) as a table;
-- nil when there is none.
local function load(key, meta)
  local packed = redis.call('GET', key)
  if packed then return cmsgpack.unpack(packed) end
  return migrate(key, meta)
end

-- Appends ARGV[from..] to stream `t` (seqs after `t.n`; the caller counts
-- them): in its value while it stays within the inline limits, else in its
-- log, the entries it held going first.
local function add_entries(t, log, from)
  local seq = t.n or 0
  if not t.l then
    local inline = t.e or {}
    local bytes = t.b or 0
    for i = from, #ARGV do bytes = bytes + string.len(ARGV[i]) end
    if #inline + #ARGV - from + 1 <= INLINE_ENTRIES and bytes <= INLINE_BYTES then
      for i = from, #ARGV do table.insert(inline, ARGV[i]) end
      t.e = inline
      return
    end
    for i, message in ipairs(inline) do
      redis.call('XADD', log, '0-' .. int(i), 'm', message)
    end
    t.e = nil
    t.l = 1
  end
  for i = from, #ARGV do
    seq = seq + 1
    redis.call('XADD', log, '0-' .. int(seq), 'm', ARGV[i])
  end
end

-- Indexes finished stream `t` (id `id`, 16 bytes `raw`) for retention: an
-- entry `<window>-<n>` of the retention stream, the window being the
-- second its finish falls in, naming the stream (`s`) and the finish's
-- offset in the window (`d`); `t.r` keeps `n`. A finish older than the
-- newest window (out of order: another instance's clock, a slow script)
-- goes to the sorted set instead, by its exact time.
local function retain(t, retention, finished, raw, id)
  local window = t.f - t.f % RETENTION_WINDOW
  local added = redis.pcall('XADD', retention, int(window) .. '-*', 's', raw, 'd', int(t.f - window))
  if type(added) == 'table' and added.err then
    redis.call('ZADD', finished, int(t.f), id)
  else
    t.r = tonumber(string.match(added, '%-(%d+)$'))
  end
end

-- Takes stream `t` out of the retention index, wherever it is.
local function unretain(t, retention, finished, id)
  if t.r and t.f then
    local window = t.f - t.f % RETENTION_WINDOW
    redis.call('XDEL', retention, int(window) .. '-' .. int(t.r))
  end
  t.r = nil
  redis.call('ZREM', finished, id)
end
"#;

/// Creates (or replaces) a stream from the value `packed.rs` made, and
/// indexes it; a live stream is owned by the instance that creates it,
/// whose lease is extended with it (so no new stream has an owner nobody
/// knows, nor one whose lease ran out a moment ago). A task leg is never
/// indexed for retention, and its keys live as long as its task's (when the
/// task is stored already).
///
/// A call that may repeat one of the session's (a client re-sending it) is
/// checked first, in the same step: when the session's stream under its one
/// request id is retained and has a params digest, that stream is the
/// call's prior and nothing is created. Returns `{0, ''}` when it created
/// the stream, `{1, prior}` for the same call (same digest), `{2, prior}`
/// for another call under the id.
///
/// The stream's opening entries are in its value, or, when too many for
/// it, written to its log here (seqs 1, 2, …); nobody follows a stream
/// before it exists, so the feed is not told.
/// KEYS: stream, session streams, abandon, finished, requests, the
/// creator's owned set, instances, log, retention, and for a task leg its
/// task.
/// ARGV: stream id, its 16 bytes, created_ms, abandon_at ('' none),
/// finished_ms ('' none), instance, lease ms, check for a prior ('1'/'0'),
/// the call's params digest as values keep it and as text ('' none),
/// prefix, the value, whether the opening entries go to the log ('1'/'0'),
/// number of opening entries, the entries, then the request ids (exactly
/// one when checking for a prior).
const CREATE: &str = r#"
local prefix = ARGV[11]
if ARGV[8] == '1' then
  local held = redis.call('HGET', KEYS[5], ARGV[#ARGV])
  local prior = held and stream_named(held)
  if prior then
    local digest, form = digest_of(prefix, prior)
    if digest then
      if (form == 'packed' and digest == ARGV[9]) or (form == 'text' and digest == ARGV[10]) then
        return {1, prior}
      end
      return {2, prior}
    end
  end
end
redis.call('DEL', KEYS[8])
redis.call('SET', KEYS[1], ARGV[12])
local opening = tonumber(ARGV[14])
local i = 15
if ARGV[13] == '1' then
  for seq = 1, opening do
    redis.call('XADD', KEYS[8], '0-' .. int(seq), 'm', ARGV[i])
    i = i + 1
  end
else
  i = i + opening
end
if ARGV[4] ~= '' then redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1]) end
local task = KEYS[10]
if task then
  local ttl = redis.call('PTTL', task)
  if ttl > 0 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    if ARGV[13] == '1' then redis.call('PEXPIRE', KEYS[8], ttl) end
  end
end
if ARGV[5] ~= '' then
  if not task then
    local t = cmsgpack.unpack(ARGV[12])
    retain(t, KEYS[9], KEYS[4], ARGV[2], ARGV[1])
    save(KEYS[1], t)
  end
else
  redis.call('SADD', KEYS[6], ARGV[1])
  renew_lease(KEYS[7], ARGV[6], ARGV[7])
end
index_requests(KEYS[5], KEYS[2], prefix, ARGV[1], ARGV[2], tonumber(ARGV[3]), i)
return {0, ''}
"#;

/// What the create script needs besides the prelude: the requests index.
/// A session's requests hash names, under each request id, the newest
/// stream (by `created_ms`) created under it: its 16 bytes (the previous
/// layout wrote `"<created_ms> <stream id>"`). A stream no id names — no
/// id, several (a batch), one a newer stream holds, or one a newer stream
/// took — is in the session's set instead, so that between them the two
/// list every stream of the session.
const REQUESTS: &str = r#"
-- The id of the stream a requests hash value names.
local function stream_named(held)
  if string.len(held) == 16 then return hex(held) end
  local space = string.find(held, ' ', 1, true)
  return space and string.sub(held, space + 1)
end

-- When stream `id` (named by `held`) was created; nil when it is gone.
local function created_of(held, prefix, id)
  local space = string.find(held, ' ', 1, true)
  if string.len(held) ~= 16 and space then return tonumber(string.sub(held, 1, space - 1)) end
  local packed = redis.call('GET', tag(prefix, id) .. ':stream')
  if not packed then return nil end
  local t = cmsgpack.unpack(packed)
  return t.C or (t.J and cjson.decode(t.J).created_ms)
end

-- Stream `id`'s params digest, and whether it is as values keep it
-- ('packed') or text (a record of the previous layout); nil when it has
-- none or is gone.
local function digest_of(prefix, id)
  local stream = tag(prefix, id)
  local packed = redis.call('GET', stream .. ':stream')
  local record
  if packed then
    local t = cmsgpack.unpack(packed)
    if t.D then return t.D, 'packed' end
    record = t.J
  else
    record = redis.call('HGET', stream .. ':meta', 'record')
  end
  local digest = record and cjson.decode(record).params_digest
  if type(digest) == 'string' then return digest, 'text' end
  return nil
end

-- Indexes new stream `id` (16 bytes `raw`, created at `created`) under the
-- request ids ARGV[from..].
local function index_requests(requests, listed, prefix, id, raw, created, from)
  local single = #ARGV == from
  if not single then redis.call('SADD', listed, id) end
  for i = from, #ARGV do
    local held = redis.call('HGET', requests, ARGV[i])
    local other = held and stream_named(held)
    local at = other and other ~= id and created_of(held, prefix, other)
    if at and at > created then
      if single then redis.call('SADD', listed, id) end
    else
      redis.call('HSET', requests, ARGV[i], raw)
      if at then redis.call('SADD', listed, other) end
    end
  end
end
"#;

/// Appends messages, counts them, records the upstream mark and a status
/// change, all or nothing, and tells the feed. Only a stream's owner logs
/// upstream messages or marks (a status alone may come from any instance:
/// a cancellation, an abandonment). Returns the last seq; -1 for no stream;
/// -2 when the writer does not own the stream (another instance took it
/// over); -3, writing nothing, when the messages would take the stream past
/// the caps given.
/// A finished stream's keys expire a while after its retention (a backstop:
/// the sweeper deletes it first, indexes and all, while any instance runs).
/// A task leg (its value has `T`) is deleted with its task instead:
/// never indexed for retention, its keys keep the TTL its task gave them.
/// On a cluster each append has a name, kept in the value (`k`): one sent
/// again under the name the value holds was applied already, and answers
/// the stream's count again without applying it twice (`write.rs`).
/// KEYS: stream, meta (the previous layout's), log, finished, feed,
/// retention.
/// ARGV: stream id, its 16 bytes, has mark ('1'/'0'), mark event id, status
/// code ('' none), finished_ms ('' when live), outcome code ('' none),
/// instance, prefix, TTL ms of a finished stream, most entries and most
/// bytes ('' for no caps), the append's name ('' none), then the messages.
const APPEND: &str = r#"
local t = load(KEYS[1], KEYS[2])
if not t then return -1 end
if ARGV[13] ~= '' and t.k == ARGV[13] then return t.n or 0 end
local owner = t.w
local was_finished = t.f ~= nil
local count = #ARGV - 13
if owner and owner ~= ARGV[8] and (count > 0 or ARGV[3] == '1') then return -2 end
local leg = t.T ~= nil
local seq = t.n or 0
local added = 0
for i = 14, #ARGV do added = added + string.len(ARGV[i]) end
if ARGV[11] ~= '' then
  if seq + count > tonumber(ARGV[11]) or (t.b or 0) + added > tonumber(ARGV[12]) then return -3 end
end
if count > 0 then
  add_entries(t, KEYS[3], 14)
  seq = seq + count
  t.n = seq
  t.b = (t.b or 0) + added
end
if ARGV[3] == '1' then
  t.u = ARGV[4]
  t.v = seq
end
local finished = ''
if ARGV[5] ~= '' then
  t.s = tonumber(ARGV[5])
  if t.s == 0 then t.s = nil end
  if ARGV[7] ~= '' then t.o = tonumber(ARGV[7]) end
  unretain(t, KEYS[6], KEYS[4], ARGV[1])
  if ARGV[6] ~= '' then
    finished = '1'
    t.f = tonumber(ARGV[6])
    if owner then redis.call('SREM', owned(ARGV[9], owner), ARGV[1]) end
    if not leg then retain(t, KEYS[6], KEYS[4], ARGV[2], ARGV[1]) end
  else
    finished = '0'
    t.f = nil
  end
end
if ARGV[13] ~= '' then t.k = ARGV[13] end
save(KEYS[1], t)
if not leg and finished == '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[10])
elseif not leg and finished == '0' then
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[3])
end
if t.l then
  -- The log lives as long as the value (it may be new, or the value's
  -- TTL just set).
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) end
end
-- A finished stream has no owner left to tell.
local live_owner = (not was_finished) and owner or nil
tell(KEYS[5], ARGV[9], live_owner, ARGV[8], 's', ARGV[1], 'q', int(seq), 'f', finished)
return seq
"#;

/// Applies a `Change`. Returns 0, or -1 for no stream.
/// KEYS: stream, meta (the previous layout's), abandon, feed.
/// ARGV: stream id, kind, value, instance.
const CHANGE: &str = r#"
local t = load(KEYS[1], KEYS[2])
if not t then return -1 end
local kind, value = ARGV[2], tonumber(ARGV[3])
local changed = false
local function raise(field)
  local old = t[field] or (field == 'h' and t.C) or 0
  if value > old then
    t[field] = value
    changed = true
    return value
  end
  return old
end
if kind == 'ack' then
  raise('a')
elseif kind == 'request' then
  raise('q')
elseif kind == 'touch' then
  local touched = raise('h')
  if t.A then
    local at = touched + t.A
    changed = changed or t.z ~= at
    t.z = at
    redis.call('ZADD', KEYS[3], int(at), ARGV[1])
  end
elseif kind == 'coalesced' then
  changed = t.c ~= 1
  t.c = 1
  feed(KEYS[4], 'i', ARGV[4], 's', ARGV[1], 'c', '1')
end
if changed then save(KEYS[1], t) end
return 0
"#;

/// Deletes a stream (in either layout) and unindexes it, and tells the feed
/// it is gone.
/// KEYS: stream, meta, log, session streams, all streams (the previous
/// layout's index), abandon, finished, requests, feed, retention.
/// ARGV: stream id, its 16 bytes, instance, prefix, then its request ids.
const DELETE: &str = r#"
local owner, live_owner
local packed = redis.call('GET', KEYS[1])
if packed then
  local t = cmsgpack.unpack(packed)
  owner = t.w
  if t.f == nil then live_owner = owner end
  unretain(t, KEYS[10], KEYS[7], ARGV[1])
else
  owner = redis.call('HGET', KEYS[2], 'owner')
  redis.call('ZREM', KEYS[7], ARGV[1])
end
if owner then redis.call('SREM', owned(ARGV[4], owner), ARGV[1]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[1])
redis.call('SREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
for i = 5, #ARGV do
  local v = redis.call('HGET', KEYS[8], ARGV[i])
  if v == ARGV[2] or (v and string.len(v) ~= 16 and string.sub(v, -string.len(ARGV[1])) == ARGV[1]) then
    redis.call('HDEL', KEYS[8], ARGV[i])
  end
end
tell(KEYS[9], ARGV[4], live_owner, ARGV[3], 's', ARGV[1], 'g', '1')
return 0
"#;

/// Writes a task record; with an expected version, only over a stored
/// record of that version (compare-and-set: versions are compared as the
/// caller's decimal strings, never as Lua numbers). The record's key, and
/// the keys of the legs it names, expire at the task's expiry plus slack (a
/// backstop: the sweeper deletes the task and its legs first). No owner is
/// checked: any instance may update any task.
/// KEYS: task, tasks (the expiry index).
/// ARGV: task id, expected version ('' for none: create or replace),
/// version, record, expires_ms, TTL ms, prefix, then the legs' stream ids.
/// Returns 1 when written, 0 when not.
const TASK: &str = r#"
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'version') ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'record', ARGV[4], 'version', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
for i = 8, #ARGV do
  local stream = tag(ARGV[7], ARGV[i])
  for _, key in ipairs({':stream', ':meta', ':log'}) do
    redis.call('PEXPIRE', stream .. key, ARGV[6])
  end
end
return 1
"#;

/// Renews an instance's lease: it is alive until Redis' clock passes the
/// returned time; -1 for a retired instance, which never renews. (An
/// instance whose lease ran out while it could not reach Redis renews like
/// any other: the streams others took over meanwhile are theirs, and its
/// own writes to them are refused.)
/// KEYS: instances. ARGV: instance, lease ms.
const RENEW: &str = r#"
return renew_lease(KEYS[1], ARGV[1], ARGV[2])
"#;

/// Hands the live streams of dead instances (lease passed) to this one:
/// their owner becomes this instance, so exactly one instance takes each
/// over. They also go into this instance's pending set, which it empties
/// only once it has read them: a claim whose answer is lost is found again
/// at the next look.
/// KEYS: instances, this instance's pending set.
/// ARGV: instance, prefix, lease ms.
const CLAIM: &str = r#"
-- Makes `me` the owner of the stream under `stream` (a tag) if `dead`
-- owns it, in either layout; whether it did.
local function take_over(stream, dead, me)
  local packed = redis.call('GET', stream .. ':stream')
  if packed then
    local t = cmsgpack.unpack(packed)
    if t.w ~= dead then return false end
    t.w = me
    save(stream .. ':stream', t)
    return true
  end
  if redis.call('HGET', stream .. ':meta', 'owner') ~= dead then return false end
  redis.call('HSET', stream .. ':meta', 'owner', me)
  return true
end
renew_lease(KEYS[1], ARGV[1], ARGV[3])
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms())
for _, instance in ipairs(dead) do
  if instance ~= ARGV[1] then
    local theirs = owned(ARGV[2], instance)
    for _, stream in ipairs(redis.call('SMEMBERS', theirs)) do
      if take_over(tag(ARGV[2], stream), instance, ARGV[1]) then
        redis.call('SADD', owned(ARGV[2], ARGV[1]), stream)
        redis.call('SADD', KEYS[2], stream)
      end
    end
    redis.call('DEL', theirs, ARGV[2] .. ':claimed:' .. instance)
    redis.call('ZREM', KEYS[1], instance)
  end
end
return 0
"#;

fn script(body: &str) -> Script {
    Script::new(&format!(
        "local FEED_LENGTH, SHARD_LENGTH = {FEED_LENGTH}, {SHARD_LENGTH}\n\
         local INLINE_ENTRIES, INLINE_BYTES = {INLINE_ENTRIES}, {INLINE_BYTES}\n\
         local RETENTION_WINDOW = {RETENTION_WINDOW}\n{PRELUDE}\n{body}"
    ))
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            create: script(&format!("{REQUESTS}\n{CREATE}")),
            append: script(APPEND),
            change: script(CHANGE),
            delete: script(DELETE),
            task: script(TASK),
            renew: script(RENEW),
            claim: script(CLAIM),
        }
    }
}
