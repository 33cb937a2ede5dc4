// msmemscope's HTML report: draws the data inlined above it (no network).
(function () {
  'use strict';
  var D = JSON.parse(document.getElementById('msmemscope-data').textContent);
  var app = document.getElementById('app');
  var SVG = 'http://www.w3.org/2000/svg';
  var COLORS = ['#2f6fdb', '#e8772e', '#3aa757', '#c83a3a', '#8a5cc7', '#8c6d4f', '#d45fa8', '#6b7385',
    '#b5b52a', '#2bb3c0', '#1f4e9c', '#a34f14', '#27733b', '#8f2424', '#5c3b8a', '#55442f'];

  function el(tag, attrs) {
    var n = document.createElement(tag);
    for (var k in attrs || {}) {
      if (k === 'text') n.textContent = attrs[k];
      else if (k === 'cls') n.className = attrs[k];
      else if (k.slice(0, 2) === 'on') n.addEventListener(k.slice(2), attrs[k]);
      else n.setAttribute(k, attrs[k]);
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c == null) continue;
      n.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    }
    return n;
  }
  function svg(tag, attrs) {
    var n = document.createElementNS(SVG, tag);
    for (var k in attrs || {}) n.setAttribute(k, attrs[k]);
    return n;
  }
  function bytes(n) {
    var neg = n < 0, u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    n = Math.abs(n);
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (neg ? '-' : '') + (i ? n.toFixed(n < 10 ? 2 : 1) : n) + ' ' + u[i];
  }
  function secs(ns, p) { return ((ns - p.t0) / 1e9).toFixed(3) + ' s'; }
  function num(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ','); }
  // The function of a frame: "func file:line (module)", "func (module+0x..)"
  // or Python's "file:line(func)".
  function fname(f) {
    var m = /^(.*):(\d+)\((.*)\)$/.exec(f);
    if (m && m[1].indexOf(' (') < 0) return m[3] + ' ' + m[1].split('/').pop() + ':' + m[2];
    m = /^(.*?) (\S+:\d+ )?\(([^()]*)\)$/.exec(f);
    return m ? m[1] : f;
  }
  function table(cls, head, rows) {
    if (!rows.length) return el('p', { cls: 'empty', text: 'none' });
    var t = el('table', { cls: cls });
    var tr = el('tr');
    head.forEach(function (h) { tr.appendChild(el('th', { cls: /^#|bytes|blocks|count|size|peak|end|allocated|temporary|step|events|frees/i.test(h) ? 'num' : '', text: h })); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      var tr = el('tr');
      r.forEach(function (c) {
        if (c instanceof Node) tr.appendChild(el('td', {}, c));
        else tr.appendChild(el('td', { cls: typeof c === 'number' ? 'num' : '', text: typeof c === 'number' ? num(c) : String(c) }));
      });
      t.appendChild(tr);
    });
    return t;
  }
  function stackCell(p, site) {
    var s = p.sites[site].stack, inner = p.frames[s[s.length - 1]];
    var d = el('details', { cls: 'stack' }, el('summary', {}, el('code', { text: inner + (s.length > 1 ? '  (+' + (s.length - 1) + ' frames)' : '') })));
    var ol = el('ol');
    for (var i = s.length - 1; i >= 0; i--) ol.appendChild(el('li', {}, el('code', { text: p.frames[s[i]] })));
    d.appendChild(ol);
    return d;
  }
  function buttons(names, onpick) {
    var box = el('div', { cls: 'controls' }), bs = [];
    names.forEach(function (n, i) {
      var b = el('button', { text: n, onclick: function () { bs.forEach(function (x) { x.className = ''; }); b.className = 'on'; onpick(n); } });
      bs.push(b);
      box.appendChild(b);
    });
    if (bs.length) bs[0].className = 'on';
    return box;
  }

  // ---- memory over time ------------------------------------------------
  function series(p, by) {
    var nt = p.types.length, out = [], framework = false;
    var items = by === 'owner' ? p.owners : p.types;
    items.forEach(function (x) { if (x.view === 1) framework = true; });
    var memory = items.some(function (x) { return x.view === 0; });
    items.forEach(function (x, i) {
      var idx = by === 'owner' ? nt + i : i;
      // By type: memory stacked, framework blocks (inside it) as lines.
      // By owner: the framework's owners when there are any.
      var stacked = by === 'owner' ? (framework ? x.view === 1 : true) : (memory ? x.view === 0 : true);
      if (by === 'owner' && !stacked) return;
      out.push({ name: x.name, idx: idx, stacked: stacked });
    });
    return out;
  }
  function chart(p, box, by, onmoment) {
    box.textContent = '';
    var W = 1000, H = 250, L = 70, B = 22, tl = p.timeline;
    if (tl.t.length && tl.t[tl.t.length - 1] < p.t1) { // the last state lasts to the end
      tl = { t: tl.t.concat([p.t1]), v: tl.v.concat([tl.v[tl.v.length - 1]]) };
    }
    var n = tl.t.length;
    var ss = series(p, by), t0 = p.t0, t1 = Math.max(p.t1, t0 + 1);
    var x = function (t) { return L + (W - L - 8) * (t - t0) / (t1 - t0); };
    var tops = [], maxv = 1;
    for (var k = 0; k < n; k++) {
      var acc = 0, v = tl.v[k];
      ss.forEach(function (s) { var y = v[s.idx] || 0; if (s.stacked) acc += y; else maxv = Math.max(maxv, y); });
      tops.push(acc);
      maxv = Math.max(maxv, acc);
    }
    var y = function (b) { return H - B - (H - B - 10) * b / maxv; };
    var g = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, cls: 'chart', 'class': 'chart', preserveAspectRatio: 'none' });
    for (var q = 0; q <= 4; q++) {
      var b = maxv * q / 4;
      g.appendChild(svg('line', { x1: L, x2: W - 8, y1: y(b), y2: y(b), stroke: '#eef0f3' }));
      var tx = svg('text', { x: 4, y: y(b) + 4 }); tx.textContent = bytes(Math.round(b)); g.appendChild(tx);
    }
    p.ranges.forEach(function (r) {
      var e = r.t1 || p.t1;
      var rect = svg('rect', { x: x(r.t0), y: H - B + 2, width: Math.max(1, x(e) - x(r.t0)), height: 6, fill: '#8a5cc7', 'class': 'range-band' });
      var ti = svg('title'); ti.textContent = 'mstx range ' + r.name + ': ' + secs(r.t0, p) + ' - ' + secs(e, p); rect.appendChild(ti);
      g.appendChild(rect);
    });
    var base = new Array(n).fill(0), ci = 0;
    ss.forEach(function (s) {
      var color = COLORS[ci++ % COLORS.length];
      s.color = color;
      if (!n) return;
      var up = [], down = [];
      for (var k = 0; k < n; k++) {
        var v = tl.v[k][s.idx] || 0, xx = x(tl.t[k]);
        if (s.stacked) { down.push(xx + ',' + y(base[k])); base[k] += v; up.push(xx + ',' + y(base[k])); }
        else up.push(xx + ',' + y(v));
      }
      if (s.stacked) g.appendChild(svg('polygon', { points: up.concat(down.reverse()).join(' '), fill: color, 'fill-opacity': 0.75, stroke: color }));
      else g.appendChild(svg('polyline', { points: up.join(' '), fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-dasharray': '5 3' }));
    });
    p.steps.forEach(function (s, i) {
      var line = svg('line', { x1: x(s.t0), x2: x(s.t0), y1: 6, y2: H - B, stroke: '#6b7385', 'stroke-dasharray': '2 3', 'class': 'step-marker' });
      var ti = svg('title'); ti.textContent = 'step ' + (i + 1) + ' starts at ' + secs(s.t0, p); line.appendChild(ti);
      g.appendChild(line);
      var lab = svg('text', { x: x(s.t0) + 2, y: 14 }); lab.textContent = String(i + 1); g.appendChild(lab);
    });
    var v = p.views[0].peak > 0 ? p.views[0] : p.views[1];
    if (v.peak > 0) {
      var px = x(v.peak_t), py = y(v.peak);
      g.appendChild(svg('circle', { cx: px, cy: py, r: 5, fill: '#c83a3a', 'class': 'peak-marker' }));
      var pl = svg('text', { x: Math.min(px + 8, W - 120), y: Math.max(py - 6, 12) }); pl.textContent = 'peak ' + bytes(v.peak); g.appendChild(pl);
    }
    var tl0 = svg('text', { x: L, y: H - 4 }); tl0.textContent = '0 s'; g.appendChild(tl0);
    var tl1 = svg('text', { x: W - 70, y: H - 4 }); tl1.textContent = ((t1 - t0) / 1e9).toFixed(3) + ' s'; g.appendChild(tl1);
    var cursor = svg('line', { x1: -10, x2: -10, y1: 6, y2: H - B, stroke: '#1d2330' });
    g.appendChild(cursor);
    g.addEventListener('click', function (ev) {
      var r = g.getBoundingClientRect(), fx = (ev.clientX - r.left) / r.width * W;
      var t = t0 + (fx - L) / (W - L - 8) * (t1 - t0);
      cursor.setAttribute('x1', fx); cursor.setAttribute('x2', fx);
      onmoment(t);
    });
    box.appendChild(g);
    var lg = el('div', { cls: 'legend' });
    ss.forEach(function (s) { lg.appendChild(el('span', {}, el('i', { style: 'background:' + s.color }), s.name + (s.stacked ? '' : ' (line: inside the memory above)'))); });
    box.appendChild(lg);
  }
  function momentTable(p, t, box) {
    box.textContent = '';
    if (!p.moments.length) return;
    var best = p.moments[0];
    p.moments.forEach(function (m) { if (Math.abs(m.t - t) < Math.abs(best.t - t)) best = m; });
    box.appendChild(el('h3', { text: 'Live at ' + secs(best.t, p) + ': the largest sites' }));
    box.appendChild(table('moment', ['Type', 'Live bytes', 'Call stack'], best.sites.map(function (s) {
      return [p.sites[s[0]].type, s[1], stackCell(p, s[0])];
    })));
  }

  // ---- flame graphs (icicle: the root on top) ---------------------------
  function flame(p, box, pick, label) {
    var root = { name: 'all', v: 0, kids: {} };
    p.sites.forEach(function (s, i) {
      var v = pick(s, i);
      if (!(v > 0)) return;
      root.v += v;
      var n = root;
      s.stack.forEach(function (f) {
        var k = n.kids[f] || (n.kids[f] = { name: p.frames[f], v: 0, kids: {} });
        k.v += v;
        n = k;
      });
    });
    function draw(top) {
      box.textContent = '';
      if (!(top.v > 0)) { box.appendChild(el('p', { cls: 'empty', text: 'nothing ' + label })); return; }
      var depth = 0;
      (function walk(n, x, w, d) {
        if (w < 0.001) return;
        depth = Math.max(depth, d);
        var c = el('div', { cls: 'fl-cell', title: n.name + '\n' + bytes(n.v) + ' (' + (100 * n.v / root.v).toFixed(1) + '%)',
          style: 'left:' + (100 * x) + '%;width:' + (100 * w) + '%;top:' + (d * 18) + 'px;background:hsl(' + (20 + (n.name.length * 37) % 40) + ',80%,' + (72 - (d % 4) * 4) + '%)',
          onclick: function () { draw(n === top ? root : n); } }, fname(n.name));
        c.dataset.frame = n.name;
        box.appendChild(c);
        var kids = Object.keys(n.kids).map(function (k) { return n.kids[k]; }).sort(function (a, b) { return b.v - a.v; });
        var cx = x;
        kids.forEach(function (k) { var kw = w * k.v / n.v; walk(k, cx, kw, d + 1); cx += kw; });
      })(top, 0, 1, 0);
      box.style.height = ((depth + 1) * 18 + 2) + 'px';
    }
    draw(root);
  }

  // ---- one process -----------------------------------------------------
  function proc(p, sec) {
    var chartBox = el('div'), momentBox = el('div');
    sec.appendChild(el('h3', { text: 'Memory over time' }));
    sec.appendChild(el('p', { cls: 'note', text: 'Live bytes, stacked; steps are dashed lines (numbered), mstx ranges bands under the axis, the peak a red dot. Click a moment for the sites live then.' }));
    var by = 'type';
    var redraw = function () { chart(p, chartBox, by, function (t) { momentTable(p, t, momentBox); }); };
    sec.appendChild(buttons(['by type', 'by owner'], function (n) { by = n === 'by owner' ? 'owner' : 'type'; redraw(); }));
    sec.appendChild(chartBox);
    sec.appendChild(momentBox);
    redraw();

    var views = p.views.map(function (v, i) { return i; }).filter(function (i) { return p.views[i].peak > 0; });
    sec.appendChild(el('h3', { text: 'Live bytes at the peak (flame graph; click a frame to zoom)' }));
    var pf = el('div', { cls: 'flame', id: 'peakflame-' + p.pid });
    var drawPeak = function (vi) { flame(p, pf, function (s) { return s.view === vi ? s.peak_b : 0; }, 'live at the peak'); };
    if (views.length > 1) sec.appendChild(buttons(views.map(function (i) { return p.views[i].name + ' (peak ' + bytes(p.views[i].peak) + ')'; }), function (n) { drawPeak(n.indexOf('framework') === 0 ? 1 : 0); }));
    else if (views.length) sec.appendChild(el('p', { cls: 'note', text: p.views[views[0]].name + ': peak ' + bytes(p.views[views[0]].peak) + ' at ' + secs(p.views[views[0]].peak_t, p) }));
    sec.appendChild(pf);
    drawPeak(views.length ? views[0] : 0);

    sec.appendChild(el('h3', { text: 'Alive at the end, by leak kind' }));
    // A kind's flame graph never adds a device's framework blocks to the
    // driver memory that holds them: those are a choice of their own.
    var kindOf = function (l) { return (l.kind || 'not judged') + (p.sites[l.site].view === 1 ? ' (framework blocks)' : ''); };
    var kinds = [];
    p.leaks.forEach(function (l) { var k = kindOf(l); if (kinds.indexOf(k) < 0) kinds.push(k); });
    var lf = el('div', { cls: 'flame', id: 'leakflame-' + p.pid });
    var drawLeak = function (k) {
      var by = {};
      p.leaks.forEach(function (l) { if (kindOf(l) === k) by[l.site] = (by[l.site] || 0) + l.bytes; });
      flame(p, lf, function (s, i) { return by[i] || 0; }, 'alive at the end');
    };
    if (kinds.length > 1) sec.appendChild(buttons(kinds, drawLeak));
    else if (kinds.length) sec.appendChild(el('p', { cls: 'note', text: kinds[0] }));
    sec.appendChild(lf);
    drawLeak(kinds[0] || 'definitely_lost');
    if (!p.leak_scan) sec.appendChild(el('p', { cls: 'note', text: 'No scan at exit judged these blocks (the leaks analysis was off, a dump was read offline, or the run did not end normally): they are every block alive at the end.' }));
    sec.appendChild(table('leaks', ['Kind', 'Type', 'Bytes', 'Blocks', 'Steps', 'Call stack'], p.leaks.slice(0, 200).map(function (l) {
      var k = el('span', { cls: 'kind-' + l.kind, text: kindOf(l) });
      return [k, p.sites[l.site].type, l.bytes, l.blocks, l.step0 === l.step1 ? l.step0 : l.step0 + '-' + l.step1, stackCell(p, l.site)];
    })));
    if (p.step_leaks && p.step_leaks.length) {
      sec.appendChild(el('h3', { text: 'Step leaks' }));
      sec.appendChild(table('step-leaks', ['Step', 'Type', 'Size', 'Call stack'], p.step_leaks.map(function (l) { return [l.step, l.type, l.size, el('code', { text: l.stack.split(';')[0] || 'N/A' })]; })));
    }

    sec.appendChild(el('h3', { text: 'Top allocation sites' }));
    var topBox = el('div');
    var cols = { bytes: 'alloc_b', count: 'alloc_n', temporary: 'temp_n', peak: 'peak_b' };
    var drawTop = function (n) {
      topBox.textContent = '';
      var key = n.split(' ').pop();
      topBox.appendChild(table('top-sites', ['Type', 'Allocated bytes', 'Allocations', 'Temporary', 'Live at peak', 'Live at end', 'Call stack'],
        (p.tops[key] || []).map(function (i) { var s = p.sites[i]; return [s.type, s.alloc_b, s.alloc_n, s.temp_n, s.peak_b, s.live_b, stackCell(p, i)]; })));
      void cols;
    };
    sec.appendChild(buttons(['by bytes', 'by count', 'by temporary', 'by peak'], drawTop));
    sec.appendChild(el('p', { cls: 'note', text: 'Temporary: a block freed before any other allocation happens (heaptrack\'s definition). Live at peak: its bytes at its view\'s peak.' }));
    sec.appendChild(topBox);
    drawTop('by bytes');

    sec.appendChild(el('h3', { text: 'Decompose: by owner' }));
    sec.appendChild(table('owners', ['Owner', 'Type', 'Live at peak', 'Live at end'], p.owners.map(function (o) { return [o.name, o.type, o.peak, o.end]; })));
    if (p.decompose && p.decompose.categories) {
      sec.appendChild(table('categories', ['Category', 'Peak bytes', 'End bytes', 'Blocks'], p.decompose.categories.map(function (c) { return [c.name, c.peak_bytes, c.end_bytes, c.blocks]; })));
    }
    sec.appendChild(el('h3', { text: 'Inefficient blocks' }));
    sec.appendChild(table('inefficient', ['Inefficient', 'Type', 'Blocks', 'Bytes', 'Call stack'], (p.inefficient || []).map(function (r) { return [r.inefficient, r.type, r.blocks, r.bytes, el('code', { text: r.stack.split(';')[0] })]; })));
    if (p.ooms && p.ooms.length) {
      sec.appendChild(el('h3', { text: 'Out of memory' }));
      sec.appendChild(table('ooms', ['Time', 'Device', 'API', 'Requested'], p.ooms.map(function (o) { return [secs(o.t, p), o.device, o.api, o.size]; })));
    }
  }

  // ---- the page ----------------------------------------------------------
  app.appendChild(el('h1', { text: D.title }));
  app.appendChild(el('div', { cls: 'meta', text: 'msmemscope ' + D.version + ', written ' + D.generated + '. Everything in this file; no network.' }));
  var procs = D.processes || [];
  procs.forEach(function (p) { // Go writes empty lists as null
    ['types', 'owners', 'views', 'steps', 'ranges', 'marks', 'ooms', 'frames', 'sites', 'leaks', 'step_leaks', 'inefficient', 'moments'].forEach(function (k) { p[k] = p[k] || []; });
    p.timeline.t = p.timeline.t || []; p.timeline.v = p.timeline.v || []; p.tops = p.tops || {};
  });
  if (procs.length) {
    app.appendChild(el('h3', { text: procs.length === 1 ? 'Summary' : 'Summary across ' + procs.length + ' processes' }));
    var tot = { events: 0, peak: 0, end: 0, lost: 0 };
    // The largest first: a run of hundreds of short commands shows the ones that matter on top.
    var byPeak = procs.slice().sort(function (a, b) { return b.views[0].peak + b.views[1].peak - a.views[0].peak - a.views[1].peak; });
    var rows = byPeak.map(function (p) {
      var lost = p.definitely_lost || 0;
      tot.events += p.events; tot.peak += p.views[0].peak; tot.end += p.views[0].end; tot.lost += lost;
      return [el('a', { href: '#proc-' + p.pid, text: String(p.pid) }), p.command || '', p.events, ((p.t1 - p.t0) / 1e9).toFixed(3) + ' s',
        bytes(p.views[0].peak), bytes(p.views[1].peak), bytes(p.views[0].end), bytes(lost), p.steps.length];
    });
    if (procs.length > 1) rows.unshift(['all', '', tot.events, '', bytes(tot.peak) + ' (sum of peaks)', '', bytes(tot.end), bytes(tot.lost), '']);
    app.appendChild(table('summary', ['Process', 'Command', 'Allocations and frees', 'Duration', 'Memory peak', 'Framework peak', 'Alive at end', 'Definitely lost', 'Steps'], rows));
  }
  procs.forEach(function (p, i) {
    var d = el('details', { cls: 'proc', id: 'proc-' + p.pid });
    d.appendChild(el('summary', {}, el('h2', { text: 'Process ' + p.pid + (p.command ? ': ' + p.command : '') })));
    var drawn = false;
    var draw = function () { if (!drawn && d.open) { drawn = true; proc(p, d); } };
    d.addEventListener('toggle', draw);
    app.appendChild(d);
    if (i === 0 || procs.length <= 4) { d.open = true; draw(); }
  });
  if (D.compare) {
    var c = D.compare;
    app.appendChild(el('h3', { text: 'Compare: ' + c.Base + ' vs ' + c.Compare }));
    app.appendChild(el('p', { text: c.Event + ': ' + c.BaseLaunches + ' launches vs ' + c.CmpLaunches + ', ' + c.Matched + ' aligned (' + c.DifferentCount + ' allocate differently), ' + c.BaseOnly + ' only in base, ' + c.CompareOnly + ' only in compare.' }));
    var na = function (v) { return v == null ? 'N/A' : v; };
    app.appendChild(table('compare', ['Name', 'Device', 'Base bytes', 'Compare bytes', 'Diff', 'Base index', 'Compare index', 'Base step', 'Compare step'],
      (c.Rows || []).slice(0, 500).map(function (r) {
        return [r.name, r.device, na(r.base), na(r.compare), r.diff, r.base == null ? 'N/A' : r.base_index, r.compare == null ? 'N/A' : r.compare_index,
          r.base == null ? 'N/A' : r.base_step, r.compare == null ? 'N/A' : r.compare_step];
      })));
  }
})();
