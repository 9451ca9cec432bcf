#include "daemons/common/status_board.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <utility>

namespace capstan::daemon {
namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The page: a heading of facts, one SVG plot per series (the last ten
// minutes), the tables; /status.json read every two seconds. Plain DOM and
// SVG, no libraries, so it works offline and in a headless browser.
const char kPage[] = R"html(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Capstan</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
#facts span { margin-right: 1.4em; white-space: nowrap; }
#facts b { font-weight: 600; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plot { border: 1px solid #ddd; border-radius: 4px; padding: 6px 8px; }
.plot .title { font-weight: 600; }
.plot .now { float: right; color: #555; margin-left: 1em; }
svg { display: block; }
table { border-collapse: collapse; margin-bottom: .3em; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f4f4f4; }
.note { color: #666; }
.bad { color: #b00020; font-weight: 600; }
.good { color: #11722a; }
#error { color: #b00020; }
</style>
</head>
<body>
<h1 id="heading">Capstan</h1>
<div id="facts"></div>
<div id="error"></div>
<h2>Last ten minutes</h2>
<div class="plots" id="plots"></div>
<div id="tables"></div>
<script>
"use strict";
const W = 320, H = 110;
function text(tag, content, cls) {
  const e = document.createElement(tag);
  e.textContent = content;
  if (cls) e.className = cls;
  return e;
}
function fmt(v) {
  if (!isFinite(v)) return String(v);
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  if (a >= 100 || v === Math.round(v)) return v.toFixed(0);
  return v.toPrecision(3);
}
const COLORS = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bc4c00", "#0969da", "#57606a"];
// One plot: its points, or several labelled lines ("lines") in one frame.
function plot(p) {
  const box = document.createElement("div");
  box.className = "plot";
  box.dataset.title = p.title;
  const lines = p.lines || [{label: "", points: p.points}];
  const all = lines.flatMap(l => l.points);
  const lastOf = l => l.points.length ? fmt(l.points[l.points.length - 1][1]) : "-";
  box.appendChild(text("span", p.title, "title"));
  box.appendChild(text("span", !all.length ? "no data yet"
      : p.lines ? lines.map(l => l.label.replace(/^worker /, "w") + " " + lastOf(l)).join("  ")
      : lastOf(lines[0]), "now"));
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  if (all.length > 0) {
    const t1 = Math.max(...all.map(q => q[0])), t0 = Math.min(...all.map(q => q[0]), t1 - 60);
    let lo = Math.min(...all.map(q => q[1])), hi = Math.max(...all.map(q => q[1]));
    if (lo > 0 && lo < hi / 2) lo = 0;
    if (hi === lo) { hi += 1; lo = Math.max(0, lo - 1); }
    const x = t => 4 + (W - 8) * (t - t0) / Math.max(t1 - t0, 1);
    const y = v => H - 14 - (H - 22) * (v - lo) / (hi - lo);
    lines.forEach((l, i) => {
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", COLORS[i % COLORS.length]);
      line.setAttribute("stroke-width", "1.5");
      line.setAttribute("points", l.points.map(q => x(q[0]).toFixed(1) + "," + y(q[1]).toFixed(1)).join(" "));
      svg.appendChild(line);
    });
    const axis = document.createElementNS(ns, "text");
    axis.setAttribute("x", 4);
    axis.setAttribute("y", H - 2);
    axis.setAttribute("font-size", "10");
    axis.setAttribute("fill", "#777");
    axis.textContent = "min " + fmt(lo) + "  max " + fmt(hi) + "  over " + Math.round(t1 - t0) + " s";
    svg.appendChild(axis);
    if (p.lines) {
      lines.forEach((l, i) => {
        const key = document.createElementNS(ns, "text");
        key.setAttribute("x", W - 4 - 52 * (lines.length - i));
        key.setAttribute("y", 10);
        key.setAttribute("font-size", "10");
        key.setAttribute("fill", COLORS[i % COLORS.length]);
        key.textContent = l.label;
        svg.appendChild(key);
      });
    }
  }
  box.appendChild(svg);
  return box;
}
function table(t) {
  const section = document.createElement("section");
  section.dataset.title = t.title;
  section.appendChild(text("h2", t.title + " (" + t.rows.length + ")"));
  if (t.rows.length) {
    const tab = document.createElement("table");
    const head = tab.insertRow();
    for (const c of t.columns) head.appendChild(text("th", c));
    for (const r of t.rows) {
      const row = tab.insertRow();
      for (const cell of r) {
        const td = text("td", cell);
        if (/^(down|lost|unreachable|not ready|failed)/.test(cell)) td.className = "bad";
        else if (/^(up|ready|healthy|running)$/.test(cell)) td.className = "good";
        row.appendChild(td);
      }
    }
    section.appendChild(tab);
  }
  if (t.note) section.appendChild(text("div", t.note, "note"));
  return section;
}
async function refresh() {
  try {
    const r = await fetch("status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("status.json: HTTP " + r.status);
    const s = await r.json();
    const facts = document.getElementById("facts");
    facts.replaceChildren();
    for (const [k, v] of s.facts) {
      if (k === "role") document.getElementById("heading").textContent = "Capstan " + v;
      const f = document.createElement("span");
      f.appendChild(text("b", k + ": "));
      f.appendChild(document.createTextNode(v));
      facts.appendChild(f);
    }
    document.title = "Capstan " + (s.facts.find(f => f[0] === "role") || ["", ""])[1];
    document.getElementById("plots").replaceChildren(...s.plots.map(plot));
    document.getElementById("tables").replaceChildren(...s.tables.map(table));
    document.getElementById("error").textContent = "";
    document.body.dataset.loaded = "yes";
  } catch (e) {
    document.getElementById("error").textContent = "cannot read status: " + e.message;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)html";

}  // namespace

StatusBoard::StatusBoard(std::chrono::seconds history, std::chrono::milliseconds every)
    : history_s_(static_cast<double>(history.count())), every_(every) {}

StatusBoard::~StatusBoard() { stop(); }

void StatusBoard::set_facts(std::vector<std::pair<std::string, std::string>> facts) {
  MutexLock lock(mutex_);
  facts_ = std::move(facts);
}

void StatusBoard::fact(std::string name, std::function<std::string()> read) {
  MutexLock lock(mutex_);
  if (!stopping_) computed_facts_.emplace_back(std::move(name), std::move(read));
}

void StatusBoard::plot(std::string title, Plot kind, std::function<double()> read) {
  auto sampled = std::make_shared<Sampled>();
  sampled->title = std::move(title);
  sampled->kind = kind;
  sampled->read = std::move(read);
  MutexLock lock(mutex_);
  if (!stopping_) plots_.push_back(std::move(sampled));
}

void StatusBoard::series(std::function<std::vector<Series>()> read) {
  MutexLock lock(mutex_);
  if (!stopping_) series_.push_back(std::move(read));
}

void StatusBoard::tables(std::function<std::vector<Table>()> build) {
  MutexLock lock(mutex_);
  if (!stopping_) tables_ = std::move(build);
}

void StatusBoard::start() {
  MutexLock lock(mutex_);
  if (sampler_.joinable() || stopping_) return;
  sampler_ = std::thread([this] {
    for (;;) {
      try {
        sample();
      } catch (...) {
        // A sample that failed as a whole (out of memory) is skipped; the
        // page shows the one before.
      }
      MutexLock lock(mutex_);
      if (!stopping_) wake_.wait_for(mutex_, every_);
      if (stopping_) return;
    }
  });
}

void StatusBoard::stop() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (sampler_.joinable()) sampler_.join();
  MutexLock lock(mutex_);
  plots_.clear();
  series_.clear();
  computed_facts_.clear();
  tables_ = nullptr;
}

void StatusBoard::sample() {
  std::vector<std::shared_ptr<Sampled>> plots;
  std::vector<std::pair<std::string, std::function<std::string()>>> computed;
  std::vector<std::function<std::vector<Series>()>> series;
  std::function<std::vector<Table>()> tables;
  {
    MutexLock lock(mutex_);
    plots = plots_;
    computed = computed_facts_;
    series = series_;
    tables = tables_;
  }
  // The service's functions run unlocked: they may take the time a trip to
  // the daemon's event loop takes, and json() does not wait for them.
  const double now = unix_now();
  const auto steady_now = std::chrono::steady_clock::now();
  const size_t max_points = static_cast<size_t>(history_s_ * 1000.0 / static_cast<double>(every_.count())) + 10;
  for (const auto& p : plots) {
    double v;
    try {
      v = p->read();
    } catch (...) {
      continue;
    }
    double shown = v;
    if (p->kind == Plot::kRate) {
      const bool first = !p->primed;
      const double dt = std::chrono::duration<double>(steady_now - p->last_at).count();
      shown = first || dt <= 0 ? NAN : (v - p->last) / dt;
      p->primed = true;
      p->last = v;
      p->last_at = steady_now;
      if (std::isnan(shown)) continue;
    }
    MutexLock lock(mutex_);
    p->points.emplace_back(now, shown);
    // By time, and by count should the wall clock step back.
    while (!p->points.empty() && (p->points.front().first < now - history_s_ || p->points.size() > max_points)) {
      p->points.pop_front();
    }
  }
  std::vector<std::pair<std::string, std::string>> facts;
  for (auto& [name, read] : computed) {
    try {
      facts.emplace_back(name, read());
    } catch (const std::exception& e) {
      facts.emplace_back(name, std::string("unknown (") + e.what() + ")");
    }
  }
  std::vector<Series> read_series;
  for (const auto& read : series) {
    try {
      for (Series& s : read()) read_series.push_back(std::move(s));
    } catch (...) {
    }
  }
  std::vector<Table> built;
  if (tables) {
    try {
      built = tables();
    } catch (...) {  // e.g. the event loop stopping (a kj::Exception)
      Table unavailable;
      unavailable.title = "Tables unavailable";
      unavailable.note = "reading the daemon's state failed (is it shutting down?)";
      built.push_back(std::move(unavailable));
    }
  }
  MutexLock lock(mutex_);
  sampled_facts_ = std::move(facts);
  sampled_series_ = std::move(read_series);
  sampled_tables_ = std::move(built);
}

std::string StatusBoard::json() const {
  nlohmann::json out;
  out["facts"] = nlohmann::json::array();
  out["plots"] = nlohmann::json::array();
  out["tables"] = nlohmann::json::array();
  auto points_of = [](const auto& points) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [t, v] : points) out.push_back({t, std::isfinite(v) ? v : 0.0});
    return out;
  };
  MutexLock lock(mutex_);
  for (const auto& [name, value] : facts_) out["facts"].push_back({name, value});
  for (const auto& [name, value] : sampled_facts_) out["facts"].push_back({name, value});
  for (const auto& p : plots_) out["plots"].push_back({{"title", p->title}, {"points", points_of(p->points)}});
  for (const Series& s : sampled_series_) {
    nlohmann::json plot = {{"title", s.title}, {"points", points_of(s.points)}};
    if (!s.lines.empty()) {
      plot["lines"] = nlohmann::json::array();
      for (const Line& l : s.lines) plot["lines"].push_back({{"label", l.label}, {"points", points_of(l.points)}});
    }
    out["plots"].push_back(std::move(plot));
  }
  for (const Table& t : sampled_tables_) {
    out["tables"].push_back({{"title", t.title}, {"columns", t.columns}, {"rows", t.rows}, {"note", t.note}});
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const std::string& StatusBoard::page() {
  static const std::string page(kPage);
  return page;
}

}  // namespace capstan::daemon
