// The report's one inline script, allowed in each page by its Content-Security-Policy through its sha256 hash only.
//
// Sortable, filterable tables: every <table class="sortable"> gets a filter box above it, and each
// of its header cells sorts the rows below it (click, or Enter / Space when focused; again: the other way).
// A cell sorts by its data-sort attribute when it has one, else by its text, read as a number where it is one
// ("1.23 ms", "950 µs", "2.59 TB/s", "12.5%", "×1.302 [1.28, 1.33]") and as text otherwise; empty cells and "–"
// go last. Rows that do not have one cell per header cell (a summary spanning columns) stay at the bottom.
//
// View state in the URL: a table's filter text and sort (by its id: f.ID=text, s.ID=column or -column) and every
// <input type="checkbox" data-state> (c.ID=1 or 0) are kept in the page's query string as they change
// (history.replaceState), and set from it when the page opens: a URL copied from the address bar reopens the view.
//
// A table's rows marked data-verdict="0" are hidden while the checkbox #hide-no-verdict is ticked.
//
// Hover texts of a long history's buckets (reports/svg.py: a <g class="hits"> per series, its dots one path per
// layer, its buckets in data-hits as "x link first last count lowest highest" separated by ";"): hovering a dot
// shows the nearest bucket's commits and median range, clicking it follows the bucket's link.
(function () {
  "use strict";
  var TIME = { s: 1, ms: 1e-3, "µs": 1e-6, us: 1e-6, ns: 1e-9 };
  var PREFIX = { T: 1e12, G: 1e9, M: 1e6, k: 1e3 };
  // a number, an optional unit, then the end or a separator (so "2026-11-29" and "62ac157" are not numbers)
  var NUMBER = /^[×~≈]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)\s*(%|s|ms|µs|us|ns|[TGMk]?(?:FLOP|B)\/s)?(?=$|[\s\[(,;·])/;

  function valueOf(cell) {
    if (!cell) return null;
    var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    var text = raw.replace(/\s+/g, " ").trim();
    if (text === "" || text === "–" || text === "-") return null;
    var m = NUMBER.exec(text);
    if (!m) return text.toLowerCase();
    var n = parseFloat(m[1]), unit = m[2] || "";
    if (Object.prototype.hasOwnProperty.call(TIME, unit)) n *= TIME[unit];
    else if (PREFIX[unit.charAt(0)]) n *= PREFIX[unit.charAt(0)];
    return isFinite(n) ? n : text.toLowerCase();
  }

  function compare(a, b) {
    if (typeof a === "number" && typeof b === "number") return a - b;
    if (typeof a === "number") return -1;  // numbers before words
    if (typeof b === "number") return 1;
    return a.localeCompare(b, undefined, { numeric: true });
  }

  var params = new URLSearchParams(window.location.search);

  function saveState(key, value) {
    if (value === null || value === "") params.delete(key);
    else params.set(key, value);
    var query = params.toString();
    try {
      window.history.replaceState(null, "", (query ? "?" + query : window.location.pathname) + window.location.hash);
    } catch (e) { /* a browser that refuses it for file: pages: the view still works, unshared */ }
  }

  function setUp(table, n) {
    var header = table.tHead && table.tHead.rows.length ? table.tHead.rows[0] : table.rows[0];
    if (!header || !header.querySelector("th")) return;
    var width = header.cells.length;
    var body = Array.prototype.filter.call(table.rows, function (row) { return row !== header; });
    body.forEach(function (row, i) { row.setAttribute("data-order", String(i)); });
    var state = { column: -1, direction: 1 };

    var box = document.createElement("div");
    box.className = "table-tools";
    var input = document.createElement("input");
    input.type = "search";
    input.className = "table-filter";
    input.placeholder = "Filter rows";
    input.setAttribute("aria-label", "Filter the rows of the table below");
    if (table.id) input.id = "filter-" + table.id;
    else input.id = "filter-table-" + n;
    var count = document.createElement("span");
    count.className = "table-count muted";
    box.appendChild(input);
    box.appendChild(count);
    var holder = table.parentNode.classList && table.parentNode.classList.contains("scroll") ? table.parentNode : table;
    holder.parentNode.insertBefore(box, holder);

    function showCount(shown) {
      count.textContent = shown === body.length ? body.length + " rows" : shown + " of " + body.length + " rows";
    }

    function applyFilter() {
      var terms = input.value.toLowerCase().split(/\s+/).filter(Boolean);
      var hideEmpty = table.hasAttribute("data-verdicts") && hideNoVerdict !== null && hideNoVerdict.checked;
      var shown = 0;
      body.forEach(function (row) {
        var text = row.textContent.toLowerCase();
        var match = terms.every(function (term) { return text.indexOf(term) !== -1; }) &&
          !(hideEmpty && row.getAttribute("data-verdict") === "0");
        row.hidden = !match;
        if (match) shown += 1;
      });
      showCount(shown);
    }
    input.addEventListener("input", function () {
      applyFilter();
      if (table.id) saveState("f." + table.id, input.value);
    });
    if (hideNoVerdict !== null && table.hasAttribute("data-verdicts")) {
      hideNoVerdict.addEventListener("change", applyFilter);
    }
    if (table.hasAttribute("data-verdicts")) applyFilter();
    else showCount(body.length);

    function sortBy(column, direction) {
      state.direction = direction || (state.column === column ? -state.direction : 1);
      state.column = column;
      if (table.id) saveState("s." + table.id, (state.direction < 0 ? "-" : "") + column);
      var direction = state.direction;
      var full = [], rest = [];
      body.forEach(function (row) { (row.cells.length === width ? full : rest).push(row); });
      var keyed = full.map(function (row) {
        return { row: row, key: valueOf(row.cells[column]), order: +row.getAttribute("data-order") };
      });
      keyed.sort(function (a, b) {
        if (a.key === null || b.key === null) {
          return a.key === b.key ? a.order - b.order : a.key === null ? 1 : -1;
        }
        return direction * compare(a.key, b.key) || a.order - b.order;
      });
      var parent = header.parentNode.tagName === "THEAD" ? table.tBodies[0] : header.parentNode;
      keyed.forEach(function (item) { parent.appendChild(item.row); });
      rest.forEach(function (row) { parent.appendChild(row); });
      Array.prototype.forEach.call(header.cells, function (th, i) {
        th.setAttribute("aria-sort", i === column ? (direction > 0 ? "ascending" : "descending") : "none");
      });
    }

    Array.prototype.forEach.call(header.cells, function (th, column) {
      th.classList.add("sort-key");
      th.tabIndex = 0;
      th.setAttribute("aria-sort", "none");
      th.addEventListener("click", function () { sortBy(column); });
      th.addEventListener("keydown", function (event) {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          sortBy(column);
        }
      });
    });

    if (table.id && params.has("f." + table.id)) {
      input.value = params.get("f." + table.id);
      applyFilter();
    }
    var sorted = table.id ? params.get("s." + table.id) : null;
    if (sorted !== null && /^-?\d+$/.test(sorted) && Math.abs(+sorted) < width) {
      sortBy(Math.abs(+sorted), sorted.charAt(0) === "-" ? -1 : 1);
    }
  }

  // checkboxes that keep their state in the URL (set before the tables, whose rows some of them hide)
  Array.prototype.forEach.call(document.querySelectorAll("input[type=checkbox][data-state]"), function (box) {
    var key = "c." + box.id;
    if (params.has(key)) box.checked = params.get(key) === "1";
    box.addEventListener("change", function () {
      saveState(key, box.checked === box.defaultChecked ? null : (box.checked ? "1" : "0"));
    });
  });
  var hideNoVerdict = document.getElementById("hide-no-verdict");

  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), setUp);

  function fmtTime(seconds) {  // reports.render.fmt_time: three significant digits in s, ms, µs or ns
    if (!isFinite(seconds)) return "–";
    var units = [["s", 1], ["ms", 1e-3], ["µs", 1e-6]];
    for (var i = 0; i < units.length; i++) {
      if (seconds >= units[i][1]) return String(Number((seconds / units[i][1]).toPrecision(3))) + " " + units[i][0];
    }
    return String(Number((seconds / 1e-9).toPrecision(3))) + " ns";
  }

  var buckets = new WeakMap();  // g.hits -> its parsed data-hits
  function bucketsOf(group) {
    if (!buckets.has(group)) {
      buckets.set(group, (group.getAttribute("data-hits") || "").split(";").map(function (text) {
        var f = text.split(" ");
        return { x: +f[0], href: decodeURIComponent(f[1]), first: decodeURIComponent(f[2]),
                 last: decodeURIComponent(f[3]), count: +f[4], lowest: +f[5], highest: +f[6] };
      }));
    }
    return buckets.get(group);
  }

  function nearest(event, path) {  // the bucket of the dot under the pointer (by x: a series' dots go left to right)
    var svg = path.ownerSVGElement, matrix = svg.getScreenCTM();
    if (!matrix) return null;
    var point = svg.createSVGPoint();
    point.x = event.clientX;
    point.y = event.clientY;
    var x = point.matrixTransform(matrix.inverse()).x, best = null;
    bucketsOf(path.parentNode).forEach(function (b) {
      if (best === null || Math.abs(b.x - x) < Math.abs(best.x - x)) best = b;
    });
    return best;
  }

  var tip = null;
  function showTip(event, text) {
    if (tip === null) {
      tip = document.createElement("div");
      tip.className = "plot-tip";
      tip.setAttribute("role", "tooltip");
      document.body.appendChild(tip);
    }
    tip.textContent = text;
    tip.hidden = false;
    tip.style.left = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + "px";
    tip.style.top = (event.clientY + 14) + "px";
  }

  function dotsAt(event) {
    var target = event.target;
    return target && target.closest && target.closest("svg.plot g.hits > path.dots");
  }

  document.addEventListener("mousemove", function (event) {
    var path = dotsAt(event), b = path && nearest(event, path);
    if (!b) {
      if (tip !== null) tip.hidden = true;
      return;
    }
    showTip(event, b.count + (b.count === 1 ? " commit " : " commits ") + b.first + " … " + b.last + "\n" +
            path.parentNode.getAttribute("data-label") + ": median " + fmtTime(b.lowest) + " – " +
            fmtTime(b.highest));
  });
  document.addEventListener("click", function (event) {
    var path = dotsAt(event), b = path && nearest(event, path);
    if (b && b.href.charAt(0) === "#") window.location.hash = b.href.slice(1);
  });
})();
