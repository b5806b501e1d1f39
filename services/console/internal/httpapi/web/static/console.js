// The Snip console's page: it polls the console's JSON endpoints and renders
// them, follows the live clicks over Server-Sent Events, and posts the
// replay and redrive actions. Everything from the system goes into the page
// as text (textContent), never as HTML.
'use strict';

const REFRESH_MS = Number(document.body.dataset.refreshMs) || 2000;
const WAREHOUSE_MS = 30000;
// POLL_TIMEOUT_MS gives up on a poll's request that has not answered: the
// next poll waits for this one, so a request that never ends would stop
// them all.
const POLL_TIMEOUT_MS = 30000;
const LIVE_ROWS = 100;

// el builds an element: el('td', {class: 'num'}, 'text', childNode).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

// NUMERIC are the column headers whose cells are numbers: their headers are
// right-aligned like the numbers under them.
const NUMERIC = new Set(['partition', 'pending', 'in flight', 'oldest unread', 'ack floor', 'redelivered', 'waiting pulls',
  'entries', 'oldest', 'count', 'clicks', 'bots', 'seq', 'p', 'attempts']);

function table(headers, rows) {
  return el('table', {},
    el('thead', {}, el('tr', {}, ...headers.map((h) => el('th', {class: NUMERIC.has(h) ? 'num' : null}, h)))),
    el('tbody', {}, ...rows));
}

// plural: plural(1, 'dead letter') is "1 dead letter", plural(2, ...) "2 dead letters".
function plural(n, one, many) {
  return num(n) + ' ' + (n === 1 ? one : (many || one + 's'));
}

function show(id, ...nodes) { document.getElementById(id).replaceChildren(...nodes); }

function age(s) {
  if (!s) return '—';
  if (s < 60) return s.toFixed(1) + ' s';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + Math.floor(s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
}

// when is a time: the time of day for today, the date and time otherwise.
function when(t) {
  if (!t) return '—';
  const d = new Date(t);
  return sameDay(d, new Date()) ? d.toLocaleTimeString() : d.toLocaleString();
}

function sameDay(a, b) { return a.toDateString() === b.toDateString(); }

// span is a short duration in seconds, rounded for people: 0.35 ms, 28 ms, 1.5 s, 2m 5s.
function span(s) {
  if (s < 0.001) return (s * 1000).toFixed(2).replace(/\.?0+$/, '') + ' ms';
  if (s < 1) return Math.round(s * 1000) + ' ms';
  if (s < 10) return s.toFixed(1) + ' s';
  return age(s);
}

// window is an alert's window: its start, and how long it lasted (the
// date once, and only when it is not today).
function windowText(start, end) {
  const a = new Date(start), b = new Date(end);
  const secs = Math.max(0, (b - a) / 1000);
  const from = sameDay(a, new Date()) ? a.toLocaleTimeString() : a.toLocaleString();
  const to = sameDay(a, b) ? b.toLocaleTimeString() : b.toLocaleString();
  if (secs < 0.001) return `${from} (under 1 ms)`; // the browser's clock has milliseconds
  return secs < 1 ? `${from} (within ${span(secs)})` : `${from} – ${to} (${span(secs)})`;
}

// GO_DURATION matches a Go duration as a service writes it ("28.363413ms",
// "1m2.5s"); readable() rounds every one in a text.
const GO_DURATION = /(?<![\w.])(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|h|m|s))+(?![\w])/g;
const UNIT = {ns: 1e-9, us: 1e-6, 'µs': 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600};

function readable(text) {
  return (text || '').replace(GO_DURATION, (d) => {
    let secs = 0;
    for (const [, n, u] of d.matchAll(/(\d+(?:\.\d+)?)(ns|us|µs|ms|h|m|s)/g)) secs += Number(n) * UNIT[u];
    return span(secs);
  });
}
function num(n) { return (n || 0).toLocaleString(); }
function level(l) { return el('span', {class: 'badge lvl-' + l}, l); }

async function request(method, path, body, signal) {
  const opts = {method, credentials: 'same-origin', headers: {Accept: 'application/json'}, signal};
  if (body !== undefined) {
    opts.headers['Content-Type'] = 'application/json';
    opts.body = JSON.stringify(body);
  }
  const r = await fetch(path, opts);
  // A 401 while the page logs out is the logout's own doing: the form's
  // answer goes to the login form saying so, which this would cut off.
  if (r.status === 401) { if (!loggingOut) location.href = '/login'; throw new Error('not logged in'); }
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(j.error ? j.error.message : r.status + ' ' + r.statusText);
  return j;
}

function failed(id, err) { show(id, el('p', {class: 'lvl-alarm'}, 'Cannot read: ' + err.message)); }

// ---- readers and other consumers

function renderReaders(s) {
  if (!s.groups.length) { show('readers', el('p', {class: 'muted'}, 'No consumer group on CLICKS yet.')); }
  else {
    show('readers', ...s.groups.map((g) => el('div', {class: 'group'},
      el('h3', {}, g.group, ' ', level(g.level), ' ',
        el('button', {type: 'button', onclick: () => openReplay(g)}, 'Replay…')),
      el('p', {}, 'pending ', el('b', {}, num(g.pending)), ', in flight ', el('b', {}, num(g.in_flight)),
        ', oldest unread ', el('b', {class: 'lvl-' + g.level}, age(g.oldest_unread_age_s)),
        g.unowned ? el('span', {class: 'lvl-alarm'}, ` — ${plural(g.unowned, 'partition')} with events and no member`) : ''),
      table(['partition', 'pending', 'in flight', 'oldest unread', 'ack floor', 'owner'],
        g.partitions.map((p) => el('tr', {class: 'lvl-' + p.level},
          el('td', {class: 'num'}, p.partition), el('td', {class: 'num'}, num(p.pending)),
          el('td', {class: 'num'}, num(p.in_flight)), el('td', {class: 'num'}, age(p.oldest_unread_age_s)),
          el('td', {class: 'num'}, p.ack_floor), el('td', {}, p.pinned ? 'pinned' : '—')))))));
  }
  show('consumers', s.consumers.length
    ? table(['stream', 'consumer', 'pending', 'in flight', 'redelivered', 'waiting pulls', 'oldest unread'],
      s.consumers.map((c) => el('tr', {class: 'lvl-' + c.level},
        el('td', {}, c.stream), el('td', {title: c.filter}, c.consumer), el('td', {class: 'num'}, num(c.pending)),
        el('td', {class: 'num'}, num(c.in_flight)), el('td', {class: 'num'}, num(c.redelivered)),
        el('td', {class: 'num'}, num(c.waiting)), el('td', {class: 'num'}, age(c.oldest_unread_age_s)))))
    : el('p', {class: 'muted'}, 'None.'));
}

// ---- replay

let replayGroup = null;
// replayWatch numbers the replay being watched: a new watch, a refusal, or
// closing the dialog, ends the one before.
let replayWatch = 0;

function openReplay(g) {
  replayGroup = g.group;
  const f = document.getElementById('replay-form');
  f.reset();
  document.getElementById('replay-group').textContent = g.group;
  document.getElementById('replay-note').textContent = g.replay_note;
  document.getElementById('replay-result').textContent = '';
  show('replay-warning');
  document.getElementById('replay-dialog').showModal();
}

async function submitReplay(ev) {
  ev.preventDefault();
  const f = ev.target;
  const kind = f.elements.kind.value;
  const body = {confirm: f.elements.confirm.value};
  if (kind === 'since') body.since = f.elements.since.value;
  else if (kind === 'from') body.from = f.elements.from.value;
  else body.from_seq = Number(f.elements.from_seq.value);
  if (f.elements.force.checked) body.force = true;
  const out = document.getElementById('replay-result');
  // The replay's warnings (a forced replay that changes nothing, one that
  // replaces the group's replay under way, one that starts later than
  // asked because CLICKS no longer holds the position) stay said, one a
  // line, while the progress above them changes.
  show('replay-warning');
  try {
    const r = await request('POST', '/api/readers/' + encodeURIComponent(replayGroup) + '/replay', body);
    out.textContent = `Replay ${r.id} requested (${r.position}). Waiting for each partition's owner…`;
    show('replay-warning', ...(r.warnings || []).map((w) => el('p', {}, 'Warning: ' + w)));
    watchReplay(replayGroup, r.id, out);
  } catch (err) {
    replayWatch++; // the progress of an earlier replay no longer shows here
    out.textContent = 'Refused: ' + err.message;
  }
}

// watchReplay polls the replay's progress every second, each poll after
// the previous one answered.
function watchReplay(group, id, out) {
  const watch = ++replayWatch;
  const tick = async () => {
    if (watch !== replayWatch) return;
    let done = false;
    try {
      const s = await request('GET', '/api/readers/' + encodeURIComponent(group) + '/replay', undefined, AbortSignal.timeout(POLL_TIMEOUT_MS));
      if (watch !== replayWatch) return;
      if (s.id !== id) { out.textContent = `Another replay (${s.id}) was requested since.`; return; }
      if (s.void) {
        // Some partition will never move back for it: no use polling on.
        out.textContent = `Replay ${id} is void: the group was deleted or created again after it was requested; ` +
          `${s.partitions_done} of ${s.partitions} partitions moved back before.`;
        return;
      }
      const atStart = (s.partition_status || []).filter(p => p.at_group_start).map(p => p.partition);
      out.textContent = `Replay ${id}: ${s.partitions_done} of ${s.partitions} partitions moved back` +
        (s.done ? '. Done: the group is reading again from there.' : ' (a partition with no live member moves when one joins)…') +
        (atStart.length ? ` Partitions ${atStart.join(', ')} start at the group's first event: it started after the replay's position.` : '');
      done = s.done;
    } catch (err) {
      // The replay is not undone by a poll that failed or ran out of time:
      // it stays requested, and asking again would replace it (the
      // partitions already moved back would move back again).
      out.textContent = `Cannot read the progress of replay ${id} (${err.message}); asking again in a second. ` +
        'The replay stays requested: each partition moves back when its owner takes it (one with no live member, when one joins). ' +
        'Do not replay again to wait for it: a new replay replaces this one, and the partitions already moved back move back again.';
    }
    if (!done) setTimeout(tick, 1000);
  };
  setTimeout(tick, 1000);
}

// ---- outbox, alerts

function renderOutbox(j) {
  if (!j.available) { show('outbox', el('p', {class: 'muted'}, j.error)); return; }
  const o = j.outbox;
  show('outbox',
    table(['lane', 'entries', 'oldest'], o.lanes.map((l) => el('tr', {class: 'lvl-' + l.level},
      el('td', {}, l.lane), el('td', {class: 'num'}, num(l.entries)), el('td', {class: 'num'}, age(l.oldest_age_s))))),
    el('p', {}, `${plural(o.shards, 'shard')}, ${plural(o.relays, 'live relay')}`,
      o.unleased_shards ? el('span', {class: 'lvl-alarm'}, `, ${plural(o.unleased_shards, 'shard')} without a relay`) : '',
      o.dead_entries ? el('span', {class: 'lvl-alarm'}, `, ${plural(o.dead_entries, 'entry', 'entries')} parked in Redis`) : ''));
}

function renderWebhooks(j) {
  if (!j.available) { show('webhooks', el('p', {class: 'muted'}, j.error)); return; }
  const w = j.webhooks;
  if (!w.total) { show('webhooks', el('p', {class: 'muted'}, 'No webhook endpoints.')); return; }
  const level = (e) => e.status === 'disabled' ? 'alarm' : (e.failing_for_s > 0 ? 'warn' : 'ok');
  show('webhooks',
    el('p', {}, `${plural(w.total, 'endpoint')}, ${plural(w.backlog, 'event')} waiting`,
      w.disabled ? el('span', {class: 'lvl-alarm'}, `, ${num(w.disabled)} disabled`) : '',
      w.failing ? el('span', {class: 'lvl-warn'}, `, ${num(w.failing)} failing`) : '',
      // The server lists the most troubled ones only.
      w.endpoints.length < w.total ? ` (the ${num(w.endpoints.length)} most troubled shown)` : ''),
    table(['endpoint', 'owner', 'host', 'status', 'backlog', 'oldest', 'failing for', 'last error'],
      w.endpoints.map((e) => el('tr', {class: 'lvl-' + level(e)},
        el('td', {}, e.id), el('td', {}, e.owner), el('td', {}, e.host), el('td', {title: e.disabled_reason || ''}, e.status),
        el('td', {class: 'num'}, num(e.backlog)), el('td', {class: 'num'}, age(e.oldest_age_s)),
        el('td', {class: 'num'}, age(e.failing_for_s)), el('td', {class: 'error'}, e.last_error || '')))));
}

function renderAlerts(j) {
  const rows = j.alerts.map((a) => el('tr', {},
    el('td', {}, when(a.ts)), el('td', {}, a.rule), el('td', {}, a.owner + '/' + a.code),
    el('td', {class: 'num'}, `${a.count} > ${a.threshold}`),
    el('td', {}, windowText(a.window_start, a.window_end)), el('td', {}, readable(a.detail))));
  show('alerts',
    el('p', {class: 'muted'}, `${plural(j.seen, 'alert')} read`, j.following ? '' : ' — not following FRAUD: ' + (j.error || 'starting')),
    rows.length ? table(['time', 'rule', 'link', 'count', 'window', 'detail'], rows) : el('p', {class: 'muted'}, 'No alerts.'));
}

// ---- dead letters

function renderDLQ(j) {
  if (!j.groups.length) { show('dlq', el('p', {class: 'muted'}, 'No dead letters.')); return; }
  show('dlq', el('p', {}, el('b', {}, num(j.total)), j.total === 1 ? ' dead letter' : ' dead letters',
    // The server lists the groups with the most letters only.
    j.groups.length < j.total_groups ? ` in ${num(j.total_groups)} groups (the ${num(j.groups.length)} with the most letters shown)` : ''),
    table(['source', 'reason', 'count', 'newest parked', 'newest error', ''], j.groups.map((g) => el('tr', {},
      el('td', {}, g.source), el('td', {}, g.reason), el('td', {class: 'num'}, num(g.count)),
      el('td', {}, when(g.newest.parked)), el('td', {class: 'error'}, g.newest.error || ''),
      el('td', {},
        el('button', {type: 'button', onclick: () => showLetters(g.source, g.reason)}, 'Letters'), ' ',
        el('button', {type: 'button', onclick: () => redriveGroup(g.source, g.reason, g.count)}, 'Redrive all'))))));
}

async function showLetters(source, reason) {
  try {
    const j = await request('GET', `/api/dlq/letters?source=${encodeURIComponent(source)}&reason=${encodeURIComponent(reason)}`);
    show('letters', el('h3', {}, `dead.${source}.${reason}`, el('span', {class: 'muted'}, ` (the oldest ${j.limit} at most)`)),
      table(['seq', 'parked', 'from', 'attempts', 'error', ''], j.letters.map((l) => el('tr', {},
        el('td', {class: 'num'}, l.seq), el('td', {}, when(l.parked)), el('td', {}, `${l.stream} #${l.orig_seq}`),
        el('td', {class: 'num'}, l.attempts), el('td', {class: 'error'}, l.error || ''),
        el('td', {},
          el('button', {type: 'button', onclick: () => showLetter(l.seq)}, 'Show'), ' ',
          el('button', {type: 'button', disabled: !l.redrive_to, title: l.redrive_refused || 'to ' + l.redrive_to,
            onclick: () => redrive(l.seq, source, reason)}, 'Redrive'))))));
  } catch (err) { failed('letters', err); }
}

async function showLetter(seq) {
  const pre = document.getElementById('letter');
  try {
    const l = await request('GET', '/api/dlq/letters/' + seq);
    const lines = [`seq ${l.seq}  ${l.subject}  parked ${when(l.parked)}`,
      `from ${l.stream} #${l.orig_seq} (${l.orig_subject}), consumer ${l.consumer || '—'}, ${plural(l.attempts, 'attempt')}`,
      l.redrive_to ? `redrive to ${l.redrive_to}` : `cannot be redriven: ${l.redrive_refused}`, '', 'headers:'];
    for (const [k, vs] of Object.entries(l.headers || {})) for (const v of vs) lines.push(`  ${k}: ${v}`);
    lines.push('', `payload (${l.payload_bytes} bytes)${l.payload_base64 ? ', base64' : ''}:`, l.payload || l.payload_base64 || '');
    pre.textContent = lines.join('\n');
    pre.hidden = false;
  } catch (err) { pre.textContent = 'Cannot read letter ' + seq + ': ' + err.message; pre.hidden = false; }
}

async function redrive(seq, source, reason) {
  if (!confirm(`Redrive dead letter ${seq} to where it came from?`)) return;
  try {
    const r = await request('POST', `/api/dlq/letters/${seq}/redrive`);
    alert(`Redriven to ${r.subject} (${r.stream} #${r.new_seq})${r.duplicate ? ', already there' : ''}.`);
  } catch (err) { alert('Redrive refused: ' + err.message); }
  showLetters(source, reason);
  poll();
}

async function redriveGroup(source, reason, count) {
  if (!confirm(`Redrive ${count === 1 ? 'the 1 dead letter' : 'all ' + plural(count, 'dead letter')} of dead.${source}.${reason}? Fix their cause first.`)) return;
  try {
    const r = await request('POST', '/api/dlq/redrive', {source, reason});
    alert(`${num(r.redriven)} redriven` + (r.refused_count ? `, ${num(r.refused_count)} cannot be (left in place)` : '') +
      (r.incomplete ? `; stopped early (${r.error}): press again for the rest` : '') + '.');
  } catch (err) { alert('Redrive refused: ' + err.message); }
  poll();
}

// ---- warehouse

function renderWarehouse(j) {
  if (!j.available) { show('warehouse', el('p', {class: 'muted'}, j.error)); return; }
  const most = Math.max(1, ...j.hours.map((h) => h.clicks));
  show('warehouse',
    el('div', {class: 'cols'},
      el('div', {}, el('h3', {}, 'Top links'), j.top_links.length
        ? table(['owner', 'link', 'clicks', 'bots'], j.top_links.map((l) => el('tr', {},
          el('td', {}, l.owner), el('td', {}, l.code), el('td', {class: 'num'}, num(l.clicks)), el('td', {class: 'num'}, num(l.bot_clicks)))))
        : el('p', {class: 'muted'}, 'No clicks in the last 24 hours.')),
      el('div', {}, el('h3', {}, 'Clicks per hour'), ...j.hours.map((h) => {
        const bar = el('span', {class: 'bar'});
        bar.style.width = (100 * h.clicks / most).toFixed(1) + '%';
        return el('div', {class: 'hour'}, el('span', {class: 'label'}, new Date(h.hour).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'})),
          bar, el('span', {class: 'num'}, num(h.clicks) + (h.bot_clicks ? ` (${plural(h.bot_clicks, 'bot')})` : '')));
      }))));
}

// ---- live clicks

let live = null;
// lastSeq is the newest click shown, of the CLICKS created at lastStream:
// a CLICKS created again starts its sequences at 1 again.
let lastSeq = 0;
let lastStream = null;
// livePaused is the operator's Pause; liveRetry the wait before the stream
// is opened again after the browser gave up on it.
let livePaused = false;
let liveRetry = null;
const LIVE_RETRY_MS = 5000;

function startLive() {
  const es = new EventSource('/api/live');
  live = es;
  live.addEventListener('click', (ev) => {
    const c = JSON.parse(ev.data);
    if (c.stream_created !== lastStream) { lastStream = c.stream_created; lastSeq = 0; }
    if (c.seq <= lastSeq) return; // a reconnect sends the recent ones again
    lastSeq = c.seq;
    const rows = document.getElementById('live');
    rows.prepend(el('tr', {class: c.bot ? 'bot' : ''},
      el('td', {}, new Date(c.ts).toLocaleTimeString()), el('td', {class: 'num'}, c.seq), el('td', {class: 'num'}, c.partition),
      el('td', {}, c.code), el('td', {}, c.owner), el('td', {}, c.country || '—'), el('td', {}, c.bot ? 'bot' : 'human'),
      el('td', {}, c.referrer_host || '—')));
    while (rows.children.length > LIVE_ROWS) rows.lastElementChild.remove();
  });
  live.addEventListener('status', (ev) => {
    const s = JSON.parse(ev.data);
    const watching = `${plural(s.browsers, 'page')} watching`;
    // Not following, the figures are of no stream: say why instead.
    document.getElementById('live-status').textContent = s.following
      ? `${s.rate.toFixed(1)} clicks/s on CLICKS · ${num(s.skipped)} not shown (rate cap) · ${num(s.dropped)} dropped for this page · ${watching}`
      : (s.error ? `not following CLICKS: ${s.error} (retrying)` : 'starting to follow CLICKS…') + ` · ${watching}`;
  });
  live.onerror = () => {
    if (es !== live) return; // paused meanwhile
    if (es.readyState !== EventSource.CLOSED) {
      document.getElementById('live-status').textContent = 'reconnecting…';
      return;
    }
    // The browser reconnects after a dropped connection, but gives up for
    // good on an answer that is not a stream (a proxy's 502 while the
    // console restarts, a 503 when too many pages watch): open it again.
    stopLive();
    document.getElementById('live-status').textContent =
      `the console refused the live clicks; trying again in ${LIVE_RETRY_MS / 1000} s`;
    liveRetry = setTimeout(() => { liveRetry = null; if (!livePaused) startLive(); }, LIVE_RETRY_MS);
  };
}

function stopLive() {
  if (live) { live.close(); live = null; }
  if (liveRetry) { clearTimeout(liveRetry); liveRetry = null; }
}

document.getElementById('live-toggle').addEventListener('click', (ev) => {
  livePaused = !livePaused;
  if (livePaused) { stopLive(); ev.target.textContent = 'Resume'; document.getElementById('live-status').textContent = 'paused'; }
  else { startLive(); ev.target.textContent = 'Pause'; }
});

// ---- polling
//
// One poll at a time: the next starts REFRESH_MS after the previous one
// finished, so a slow server is not sent a pile of overlapping requests.

async function pollPanels() {
  const get = (path) => request('GET', path, undefined, AbortSignal.timeout(POLL_TIMEOUT_MS));
  const jobs = [
    get('/api/readers').then(renderReaders, (e) => { failed('readers', e); failed('consumers', e); }),
    get('/api/outbox').then(renderOutbox, (e) => failed('outbox', e)),
    get('/api/webhooks').then(renderWebhooks, (e) => failed('webhooks', e)),
    get('/api/alerts').then(renderAlerts, (e) => failed('alerts', e)),
    get('/api/dlq').then(renderDLQ, (e) => failed('dlq', e)),
  ];
  await Promise.allSettled(jobs);
  document.getElementById('updated').textContent = 'Updated ' + new Date().toLocaleTimeString();
}

// poll refreshes the panels now. While a poll is in flight it starts none
// beside it: it asks for one more after it (an action's result shows).
let polling = null;
let pollAgain = false;
function poll() {
  if (polling) { pollAgain = true; return polling; }
  polling = (async () => {
    do { pollAgain = false; await pollPanels(); } while (pollAgain);
  })().finally(() => { polling = null; });
  return polling;
}

async function pollWarehouse() {
  await request('GET', '/api/warehouse', undefined, AbortSignal.timeout(POLL_TIMEOUT_MS)).then(renderWarehouse, (e) => failed('warehouse', e));
}

// every runs fn now, and again ms after each run finished.
async function every(ms, fn) {
  try { await fn(); } catch (err) { /* fn shows its own failures */ }
  setTimeout(() => every(ms, fn), ms);
}

document.getElementById('replay-form').addEventListener('submit', submitReplay);

// Log out: the session ends on the server before the form's answer comes,
// so a panel's poll meanwhile gets 401; loggingOut keeps it from sending
// the page to the login form without the logout's notice.
let loggingOut = false;
document.querySelector('form[action="/logout"]')?.addEventListener('submit', () => {
  loggingOut = true;
  stopLive();
});
document.getElementById('replay-close').addEventListener('click', () => {
  replayWatch++;
  document.getElementById('replay-dialog').close();
});

// The page arrives with the panels' first figures (those the server had
// within a moment), so the first paint shows them instead of placeholders.
function renderInitial() {
  const holder = document.getElementById('initial');
  let j = {};
  try { j = JSON.parse(holder.dataset.json || '{}'); } catch (err) { return; }
  if (j.readers) renderReaders(j.readers);
  if (j.outbox) renderOutbox(j.outbox);
  if (j.webhooks) renderWebhooks(j.webhooks);
  if (j.alerts) renderAlerts(j.alerts);
  if (j.dlq) renderDLQ(j.dlq);
  if (j.warehouse) renderWarehouse(j.warehouse);
  if (Object.keys(j).length) document.getElementById('updated').textContent = 'Updated ' + new Date().toLocaleTimeString();
}

renderInitial();
every(REFRESH_MS, poll);
every(WAREHOUSE_MS, pollWarehouse);
startLive();
