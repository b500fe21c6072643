// traceanalyzer HTML report: run pages, the zoomable timeline, links from findings.
// Strings from traces reach the page only through textContent and canvas fillText.
(function () {
  'use strict';

  var KIND_COLORS = ['#3b6fd8', '#e8871e', '#2ca25f', '#9467bd', '#8c8c8c', '#a0522d'];  // html_timeline.KIND_CODES
  var SEV_COLORS = { error: '#d62728', warning: '#e0a000', info: '#17a2b8' };
  var LABEL_W = 150, HEADER_H = 24, DEV_GAP = 6, AXIS_H = 26;
  var timelines = {};

  function fmtNs(x) {
    var a = Math.abs(x);
    if (a >= 1e9) return (x / 1e9).toPrecision(3) + ' s';
    if (a >= 1e6) return (x / 1e6).toPrecision(3) + ' ms';
    if (a >= 1e3) return (x / 1e3).toPrecision(3) + ' us';
    return Math.round(x) + ' ns';
  }

  var UNITS = [[1e9, 's'], [1e6, 'ms'], [1e3, 'us'], [1, 'ns']];

  // The unit a time of magnitude `a` (ns) is written in.
  function unitOf(a) {
    for (var i = 0; i < UNITS.length - 1; i++) if (a >= UNITS[i][0]) return UNITS[i];
    return UNITS[UNITS.length - 1];
  }

  // A point in time written to resolution `res` (ns: the step between axis ticks, a pixel),
  // in `unit` (default: the time's own): as many decimals as tell times `res` apart, so that
  // zoomed in to microseconds late in a run the ticks read 170.002 ms, 170.004 ms, ...
  function fmtAt(x, res, unit) {
    var u = unit || unitOf(Math.max(Math.abs(x), res));
    var dec = Math.max(0, Math.min(9, -Math.floor(Math.log10(res / u[0]) + 1e-9)));
    return (x / u[0]).toFixed(dec) + ' ' + u[1];
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function decodeBins(b64) {
    var s = atob(b64), a = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) a[i] = s.charCodeAt(i);
    return a;
  }

  function niceStep(raw) {
    var mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var steps = [1, 2, 5, 10];
    for (var i = 0; i < steps.length; i++) if (steps[i] * mag >= raw) return steps[i] * mag;
    return 10 * mag;
  }

  function Timeline(root, data, runId) {
    this.root = root; this.data = data; this.runId = runId;
    this.tracks = data.tracks;
    for (var t = 0; t < this.tracks.length; t++) {
      var tr = this.tracks[t], n = tr.s.length, acc = 0;
      tr.start = new Float64Array(n);
      for (var i = 0; i < n; i++) { acc += tr.s[i]; tr.start[i] = acc; }
      if (tr.bins) {
        tr.binArr = {};
        for (var k in tr.bins) tr.binArr[k] = decodeBins(tr.bins[k]);
      }
    }
    var pad = data.span * 0.01;
    this.home = [-pad, data.span + pad];
    this.v0 = this.home[0]; this.v1 = this.home[1];
    this.build();
  }

  Timeline.prototype.build = function () {
    var self = this, root = this.root;
    var bar = el('div', 'toolbar');
    var zin = el('button', '', '+'), zout = el('button', '', '−'), reset = el('button', '', 'reset');
    zin.title = 'zoom in'; zout.title = 'zoom out'; reset.title = 'show the whole run';
    zin.addEventListener('click', function () { self.zoomBy(0.5, 0.5); });
    zout.addEventListener('click', function () { self.zoomBy(2, 0.5); });
    reset.addEventListener('click', function () { self.setView(self.home[0], self.home[1]); });
    bar.appendChild(zin); bar.appendChild(zout); bar.appendChild(reset);
    var legend = el('span', 'legend');
    this.data.kinds.forEach(function (k, i) {
      var s = el('span'), sw = el('i');
      sw.style.background = KIND_COLORS[i];
      s.appendChild(sw); s.appendChild(document.createTextNode(k)); legend.appendChild(s);
    });
    ['error', 'warning', 'info'].forEach(function (k) {
      var s = el('span'), sw = el('i');
      sw.style.background = SEV_COLORS[k]; sw.style.opacity = '0.6';
      s.appendChild(sw); s.appendChild(document.createTextNode(k + ' finding')); legend.appendChild(s);
    });
    bar.appendChild(legend);
    this.status = el('span', 'status');
    bar.appendChild(this.status);
    root.appendChild(bar);
    this.canvas = el('canvas');
    root.appendChild(this.canvas);
    this.tip = el('div', 'tip');
    root.appendChild(this.tip);
    this.layoutRows();
    var c = this.canvas;
    c.addEventListener('wheel', function (ev) {
      ev.preventDefault();
      var r = c.getBoundingClientRect(), fx = (ev.clientX - r.left - LABEL_W) / (r.width - LABEL_W);
      self.zoomBy(Math.exp(Math.max(-1, Math.min(1, ev.deltaY * 0.002))), Math.max(0, Math.min(1, fx)));
    }, { passive: false });
    var drag = null;
    c.addEventListener('mousedown', function (ev) {
      drag = { x: ev.clientX, v0: self.v0, v1: self.v1, moved: false };
      c.classList.add('dragging');
    });
    window.addEventListener('mouseup', function (ev) {
      if (!drag) return;
      c.classList.remove('dragging');
      var moved = drag.moved;
      drag = null;
      if (!moved) self.click(ev);
    });
    window.addEventListener('mousemove', function (ev) {
      if (drag) {
        var w = c.getBoundingClientRect().width - LABEL_W, dx = ev.clientX - drag.x;
        if (Math.abs(dx) > 2) drag.moved = true;
        var dt = -dx / w * (drag.v1 - drag.v0);
        self.setView(drag.v0 + dt, drag.v1 + dt);
        self.tip.style.display = 'none';
      } else if (ev.target === c) {
        self.hover(ev);
      } else {
        self.tip.style.display = 'none';
      }
    });
    c.addEventListener('mouseleave', function () { self.tip.style.display = 'none'; });
    c.addEventListener('dblclick', function () { self.setView(self.home[0], self.home[1]); });
  };

  Timeline.prototype.layoutRows = function () {
    var y = HEADER_H, prev = null;
    this.rowH = this.tracks.length <= 4 ? 30 : 20;
    this.rows = [];
    for (var i = 0; i < this.tracks.length; i++) {
      var tr = this.tracks[i];
      if (prev !== null && tr.device !== prev) y += DEV_GAP;
      prev = tr.device;
      this.rows.push({ y: y, track: tr });
      y += this.rowH;
    }
    this.height = y + AXIS_H;
  };

  Timeline.prototype.x = function (t) { return LABEL_W + (t - this.v0) * this.scale; };
  Timeline.prototype.t = function (x) { return this.v0 + (x - LABEL_W) / this.scale; };

  Timeline.prototype.setView = function (a, b) {
    var minW = 200, span = this.data.span, lo = -span * 0.05, hi = span * 1.05;
    if (b - a < minW) { var m = (a + b) / 2; a = m - minW / 2; b = m + minW / 2; }
    if (b - a > hi - lo) { a = lo; b = hi; }
    if (a < lo) { b += lo - a; a = lo; }
    if (b > hi) { a -= b - hi; b = hi; }
    this.v0 = a; this.v1 = b;
    this.draw();
  };

  Timeline.prototype.zoomBy = function (f, frac) {
    var at = this.v0 + (this.v1 - this.v0) * frac;
    this.setView(at - (at - this.v0) * f, at + (this.v1 - at) * f);
  };

  Timeline.prototype.zoomTo = function (s, e) {
    var w = Math.max(e - s, 1000), pad = w * 0.6;
    this.setView(s - pad, e + pad);
    this.flash = { s: s, e: e, until: Date.now() + 1500 };
  };

  Timeline.prototype.draw = function () {
    var c = this.canvas, dpr = window.devicePixelRatio || 1;
    var width = Math.max(300, this.root.clientWidth);
    if (!this.root.clientWidth) return;  // hidden: drawn when its page is shown
    c.width = Math.round(width * dpr); c.height = Math.round(this.height * dpr);
    c.style.height = this.height + 'px';
    var ctx = c.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    this.width = width;
    this.plotW = width - LABEL_W;
    this.scale = this.plotW / (this.v1 - this.v0);
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, width, this.height);
    ctx.fillStyle = '#f3f5f8'; ctx.fillRect(LABEL_W, 0, this.plotW, HEADER_H - 2);
    for (var r = 0; r < this.rows.length; r++) {
      var row = this.rows[r];
      ctx.fillStyle = r % 2 ? '#fafbfd' : '#ffffff';
      ctx.fillRect(LABEL_W, row.y, this.plotW, this.rowH);
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(LABEL_W, 0, this.plotW, this.height); ctx.clip();
    this.drawMarkers(ctx, 'fill');
    for (r = 0; r < this.rows.length; r++) this.drawTrack(ctx, this.rows[r]);
    this.drawMarkers(ctx, 'outline');
    if (this.flash && Date.now() < this.flash.until) {
      ctx.strokeStyle = '#111'; ctx.lineWidth = 2; ctx.setLineDash([4, 3]);
      var fx0 = this.x(this.flash.s), fx1 = Math.max(this.x(this.flash.e), fx0 + 3);
      ctx.strokeRect(fx0 - 1, 1, fx1 - fx0 + 2, this.height - AXIS_H - 2);
      ctx.setLineDash([]);
    }
    ctx.restore();
    this.drawLabels(ctx);
    this.drawAxis(ctx);
    var shown = this.data.sampled ? ' (' + this.data.shown_ops + ' of ' + this.data.total_ops + ' drawn one by one)' : '';
    var res = (this.v1 - this.v0) / 100;
    this.status.textContent = 'view ' + fmtAt(this.v0 + this.data.origin, res) + ' – ' +
      fmtAt(this.v1 + this.data.origin, res) + shown;
    this.root.setAttribute('data-drawn', String((+this.root.getAttribute('data-drawn') || 0) + 1));
  };

  // Per pixel column, how much of it each kind of operation covers; wide operations are
  // drawn as boxes with their names, narrow ones only add to the coverage.
  Timeline.prototype.drawTrack = function (ctx, row) {
    var tr = row.track, W = Math.ceil(this.plotW) + 1, nk = KIND_COLORS.length;
    var cov = new Float32Array(W * nk), boxes = [];
    var v0 = this.v0, v1 = this.v1, scale = this.scale;
    if (tr.binArr) {  // shading from the per-bin busy shares (every operation counted)
      var bw = this.data.bin_ns, nb = this.data.n_bins;
      for (var k in tr.binArr) {
        var arr = tr.binArr[k], kk = +k;
        for (var px = 0; px < W; px++) {
          var ta = v0 + px / scale, tb = v0 + (px + 1) / scale;
          var b0 = Math.max(0, Math.floor(ta / bw)), b1 = Math.min(nb - 1, Math.floor(tb / bw));
          var sum = 0, n = 0;
          for (var b = b0; b <= b1; b++) { sum += arr[b]; n++; }
          if (n && sum) cov[px * nk + kk] = Math.max(cov[px * nk + kk], sum / n / 255);
        }
      }
    }
    var st = tr.start, d = tr.d, kinds = tr.k, lo = 0, hi = st.length;
    var from = v0 - tr.max_dur;  // first op that can still reach into the view
    while (lo < hi) { var mid = (lo + hi) >> 1; if (st[mid] < from) lo = mid + 1; else hi = mid; }
    for (var i = lo; i < st.length && st[i] <= v1; i++) {
      var e = st[i] + d[i];
      if (e < v0) continue;
      var x0 = (st[i] - v0) * scale, x1 = (e - v0) * scale;
      if (x1 - x0 >= 3) { boxes.push(i); continue; }
      var a = Math.max(0, x0), bEnd = Math.min(W - 1e-6, x1), kind = kinds[i];
      if (bEnd < a) bEnd = a + 0.01;
      for (var p = Math.floor(a); p <= Math.floor(bEnd) && p < W; p++) {
        var part = Math.min(bEnd, p + 1) - Math.max(a, p);
        cov[p * nk + kind] += Math.max(part, 0.15);
      }
    }
    var y = row.y + 2, h = this.rowH - 4;
    for (var q = 0; q < W; q++) {
      var best = -1, bestV = 0, tot = 0;
      for (var j = 0; j < nk; j++) { var v = cov[q * nk + j]; tot += v; if (v > bestV) { bestV = v; best = j; } }
      if (best < 0) continue;
      ctx.globalAlpha = Math.min(1, 0.3 + 0.7 * Math.min(1, tot));
      ctx.fillStyle = KIND_COLORS[best];
      ctx.fillRect(LABEL_W + q, y, 1, h);
    }
    ctx.globalAlpha = 1;
    ctx.font = '11px system-ui, sans-serif';
    for (var bi = 0; bi < boxes.length; bi++) {
      var o = boxes[bi], bx0 = LABEL_W + (st[o] - v0) * scale, bx1 = LABEL_W + (st[o] + d[o] - v0) * scale;
      var cx0 = Math.max(bx0, LABEL_W - 2), cx1 = Math.min(bx1, LABEL_W + this.plotW + 2);
      ctx.fillStyle = KIND_COLORS[kinds[o]];
      ctx.fillRect(cx0, y, cx1 - cx0, h);
      ctx.strokeStyle = 'rgba(255,255,255,0.8)'; ctx.lineWidth = 1;
      ctx.strokeRect(cx0 + 0.5, y + 0.5, cx1 - cx0 - 1, h - 1);
      if (cx1 - cx0 > 40) {
        ctx.save(); ctx.beginPath(); ctx.rect(cx0 + 2, y, cx1 - cx0 - 4, h); ctx.clip();
        ctx.fillStyle = '#fff'; ctx.fillText(this.data.names[tr.n[o]], cx0 + 4, y + h / 2 + 4);
        ctx.restore();
      }
    }
  };

  Timeline.prototype.markerRows = function (m) {
    var out = [];
    for (var r = 0; r < this.rows.length; r++) {
      var tr = this.rows[r].track;
      if ((m.dev === null || m.dev === tr.device) && (m.st === null || m.st === tr.stream)) out.push(this.rows[r]);
    }
    return out;
  };

  // Two passes: a light band behind the operations (so a flagged gap shows up and the
  // operations keep their colors), then outlines and the top-row bars over them. A long
  // range (`m.long`: a finding about a whole run or stretch) is only a thin bracket in the
  // top row and a thin line under its tracks, so that it does not tint what it spans.
  Timeline.prototype.drawMarkers = function (ctx, pass) {
    var ms = this.data.markers, h = this.rowH;
    for (var i = 0; i < ms.length; i++) {
      var m = ms[i], x0 = this.x(m.s), x1 = this.x(m.e);
      if (x1 < LABEL_W - 4 || x0 > this.width + 4) continue;
      if (x1 - x0 < 3) { var mid = (x0 + x1) / 2; x0 = mid - 1.5; x1 = mid + 1.5; }
      var color = SEV_COLORS[m.sev] || '#888', rows = this.markerRows(m), r;
      ctx.fillStyle = color; ctx.strokeStyle = color;
      if (m.long) {
        if (pass === 'fill') continue;
        var by = m.main ? 8 : 16;
        ctx.globalAlpha = m.main ? 0.9 : 0.6;
        ctx.fillRect(x0, by - 1, x1 - x0, 2);
        ctx.fillRect(x0, by - 4, 1.5, 8); ctx.fillRect(x1 - 1.5, by - 4, 1.5, 8);
        ctx.globalAlpha = 0.7;
        for (r = 0; r < rows.length; r++) ctx.fillRect(x0, rows[r].y + h - 2, x1 - x0, 2);
        continue;
      }
      if (pass === 'fill') {
        ctx.globalAlpha = m.st === null ? 0.12 : 0.3;
        for (r = 0; r < rows.length; r++) ctx.fillRect(x0, rows[r].y, x1 - x0, h);
      } else {
        ctx.globalAlpha = m.main ? 0.9 : 0.55;
        ctx.fillRect(x0, m.main ? 4 : 13, x1 - x0, m.main ? 8 : 6);
        if (m.st !== null) {
          ctx.globalAlpha = 0.9; ctx.lineWidth = 1.5;
          for (r = 0; r < rows.length; r++) ctx.strokeRect(x0 + 0.75, rows[r].y + 0.75, x1 - x0 - 1.5, h - 1.5);
        }
      }
    }
    ctx.globalAlpha = 1;
  };

  Timeline.prototype.drawLabels = function (ctx) {
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, LABEL_W, this.height);
    ctx.fillStyle = '#5f6b7a'; ctx.font = '11px system-ui, sans-serif';
    ctx.fillText('findings', 8, 16);
    ctx.fillStyle = '#1d2330'; ctx.font = '12px system-ui, sans-serif';
    for (var r = 0; r < this.rows.length; r++) {
      var tr = this.rows[r].track;
      var label = 'GPU ' + (tr.device === null ? '?' : tr.device) + ' · stream ' + (tr.stream === null ? '?' : tr.stream);
      ctx.fillText(label, 8, this.rows[r].y + this.rowH / 2 + 4);
    }
    ctx.strokeStyle = '#d9dee6'; ctx.beginPath(); ctx.moveTo(LABEL_W - 0.5, 0); ctx.lineTo(LABEL_W - 0.5, this.height); ctx.stroke();
  };

  Timeline.prototype.drawAxis = function (ctx) {
    var y = this.height - AXIS_H, step = niceStep((this.v1 - this.v0) / Math.max(2, this.plotW / 110));
    var origin = this.data.origin;
    ctx.strokeStyle = '#c5ccd6'; ctx.beginPath(); ctx.moveTo(LABEL_W, y + 0.5); ctx.lineTo(this.width, y + 0.5); ctx.stroke();
    ctx.fillStyle = '#5f6b7a'; ctx.font = '11px system-ui, sans-serif'; ctx.textAlign = 'center';
    // One unit for the whole axis (the largest time in view's), decimals from the step.
    var unit = unitOf(Math.max(Math.abs(this.v0 + origin), Math.abs(this.v1 + origin), step)), labels = [];
    var first = Math.ceil((this.v0 + origin) / step);
    for (var k = first; k * step <= this.v1 + origin; k++) {
      var t = k * step, x = this.x(t - origin);  // k * step: no error piles up over the ticks
      if (x < LABEL_W + 20) continue;
      var label = fmtAt(t, step, unit);
      ctx.beginPath(); ctx.moveTo(x + 0.5, y); ctx.lineTo(x + 0.5, y + 5); ctx.stroke();
      ctx.fillText(label, x, y + 17);
      labels.push(label);
    }
    this.root.setAttribute('data-ticks', labels.join('|'));  // what the axis reads, for tests
    ctx.textAlign = 'left';
    ctx.fillText('time into the run', 8, y + 17);
  };

  Timeline.prototype.opAt = function (tr, t, tol) {
    var st = tr.start, d = tr.d, lo = 0, hi = st.length, from = t - tr.max_dur - tol, best = -1, bestD = Infinity;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (st[mid] < from) lo = mid + 1; else hi = mid; }
    for (var i = lo; i < st.length && st[i] <= t + tol; i++) {
      var e = st[i] + d[i], dist = t < st[i] ? st[i] - t : (t > e ? t - e : 0);
      if (dist <= tol && dist < bestD) { best = i; bestD = dist; }
    }
    return best;
  };

  Timeline.prototype.hit = function (ev) {
    var r = this.canvas.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    if (x < LABEL_W) return null;
    var t = this.t(x), tol = 3 / this.scale, hits = { x: x, y: y, markers: [], op: null };
    var row = null;
    for (var i = 0; i < this.rows.length; i++) if (y >= this.rows[i].y && y < this.rows[i].y + this.rowH) row = this.rows[i];
    var ms = this.data.markers;
    for (var j = 0; j < ms.length; j++) {
      var m = ms[j];
      if (t < m.s - tol || t > m.e + tol) continue;
      if (y < HEADER_H || (!m.long && row && this.markerRows(m).indexOf(row) >= 0)) hits.markers.push(m);
    }
    if (row) {
      var o = this.opAt(row.track, t, tol);
      if (o >= 0) hits.op = { track: row.track, i: o };
    }
    return hits;
  };

  Timeline.prototype.hover = function (ev) {
    var h = this.hit(ev), tip = this.tip;
    if (!h || (!h.op && !h.markers.length)) { tip.style.display = 'none'; return; }
    var lines = [];
    if (h.op) {
      var tr = h.op.track, i = h.op.i;
      lines.push(this.data.names[tr.n[i]]);
      lines.push(this.data.kinds[tr.k[i]] + ' · ' + fmtNs(tr.d[i]) + ' · at ' +
                 fmtAt(tr.start[i] + this.data.origin, Math.max(1, 1 / this.scale)));
    }
    var seen = {};
    for (var j = 0; j < h.markers.length && j < 4; j++) {
      var f = this.data.findings[h.markers[j].f];
      if (!f || seen[h.markers[j].f]) continue;
      seen[h.markers[j].f] = 1;
      lines.push(f.sev + ' ' + f.rule + ': ' + f.msg);
    }
    tip.textContent = lines.join('\n');
    tip.style.display = 'block';
    var left = h.x + 14, maxLeft = this.root.clientWidth - tip.offsetWidth - 4;
    tip.style.left = Math.max(0, Math.min(left, maxLeft)) + 'px';
    tip.style.top = (this.canvas.offsetTop + h.y + 16) + 'px';
  };

  Timeline.prototype.click = function (ev) {
    if (ev.target !== this.canvas) return;
    var h = this.hit(ev);
    if (!h || !h.markers.length) return;
    var f = this.data.findings[h.markers[0].f];
    var card = f && f.card != null ? document.getElementById('f-' + this.runId + '-' + f.card) : null;
    if (card) {
      for (var d = card.parentElement; d; d = d.parentElement) if (d.tagName === 'DETAILS') d.open = true;
      card.scrollIntoView({ block: 'center' });
      card.classList.remove('flash'); void card.offsetWidth; card.classList.add('flash');
    }
  };

  function ensureTimelines(scope) {
    var roots = scope.querySelectorAll('.timeline[data-run]');
    for (var i = 0; i < roots.length; i++) {
      var root = roots[i], run = root.getAttribute('data-run');
      if (!timelines[run]) {
        var block = document.getElementById('tl-' + run);
        if (!block) continue;
        timelines[run] = new Timeline(root, JSON.parse(block.textContent), run);
      }
      timelines[run].draw();
    }
  }

  function sectionFor(id) {
    if (!id) return null;
    var target = document.getElementById(id);
    while (target && !(target.tagName === 'SECTION' && (target.classList.contains('run') || target.id === 'index'))) {
      target = target.parentElement;
    }
    return target;
  }

  function hashId() {
    try { return decodeURIComponent(location.hash.slice(1)); } catch (e) { return ''; }
  }

  function showPage() {
    var index = document.getElementById('index');
    if (!index) { ensureTimelines(document); return; }
    document.body.classList.add('paged');
    var want = sectionFor(hashId()) || index;
    var secs = document.querySelectorAll('section.run, section.index');
    for (var i = 0; i < secs.length; i++) secs[i].classList.toggle('active', secs[i] === want);
    if (want !== index) ensureTimelines(want);
    var target = hashId() ? document.getElementById(hashId()) : null;
    if (target && target !== want) {
      for (var d = target.parentElement; d; d = d.parentElement) if (d.tagName === 'DETAILS') d.open = true;
      target.scrollIntoView();
    }
    else window.scrollTo(0, 0);
  }

  document.addEventListener('click', function (ev) {
    var b = ev.target.closest ? ev.target.closest('button.zoom') : null;
    if (!b) return;
    var tl = timelines[b.getAttribute('data-run')];
    if (!tl) return;
    var origin = tl.data.origin;
    tl.zoomTo(+b.getAttribute('data-s') - origin, +b.getAttribute('data-e') - origin);
    tl.root.scrollIntoView({ block: 'center' });
    setTimeout(function () { tl.draw(); }, 1600);  // clear the flash outline
  });

  var resizeTimer = null;
  window.addEventListener('resize', function () {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(function () { for (var k in timelines) timelines[k].draw(); }, 100);
  });
  window.addEventListener('hashchange', showPage);
  showPage();
})();
