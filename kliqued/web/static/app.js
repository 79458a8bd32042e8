// Klique dashboard: draws the charts (plotly.js, served by the daemon from the plotly
// package) and keeps the page's live part current without a reload: it asks for the
// fragment at the pass rate; the daemon answers 204 when no event happened since.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");

  function drawCharts(root) {
    if (!window.Plotly) { return; }
    root.querySelectorAll("[data-chart]").forEach(function (el) {
      var src = document.getElementById(el.getAttribute("data-chart"));
      if (!src) { return; }
      var fig = JSON.parse(src.textContent);
      var layout = Object.assign({margin: {t: 40, r: 10, b: 50, l: 60}, height: 300,
                                  font: {size: 13}, paper_bgcolor: "#ffffff"}, fig.layout || {});
      window.Plotly.react(el, fig.data, layout, {responsive: true, displaylogo: false});
    });
  }

  // The status is a live region: it changes (and is read out) only when updates stop or
  // resume; the time of the last update is plain text beside it.
  var paused = false;
  function status(text) {
    var s = document.querySelector("[data-live-status]");
    if (s && s.textContent !== text) { s.textContent = text; }
  }
  function updated() {
    var t = document.querySelector("[data-live-time]");
    // UTC and 24-hour, as every time the pages print (the footer says so once)
    if (t) { t.textContent = "Updated " + new Date().toISOString().slice(11, 19) + "."; }
    if (paused) { paused = false; status("Live updates resumed."); }
  }

  // Forms in the live part (cancel) carry the session's CSRF value: a live fragment is
  // shared by the principal's sessions and holds none, so it is copied from the page's
  // sign-out form, which has it.
  function fillCsrf(root) {
    var own = document.querySelector("form.signout input[name=csrf]");
    if (!own) { return; }
    root.querySelectorAll("input[data-csrf]").forEach(function (el) {
      if (!el.value) { el.value = own.value; }
    });
  }
  // A cancel asks first: a click cannot end a week of training by accident.
  document.addEventListener("submit", function (e) {
    var q = e.target.getAttribute && e.target.getAttribute("data-confirm");
    if (q && !window.confirm(q)) { e.preventDefault(); }
  });

  if (!live) { return; }
  var passMs = Math.max(1000, parseInt(live.getAttribute("data-pass-ms"), 10) || 1000);
  var refreshMs = parseInt(live.getAttribute("data-refresh-ms"), 10) || 15000;
  var lastFull = Date.now();

  function tick() {
    var url = new URL(window.location.href);
    url.searchParams.set("live", "1");
    url.searchParams.set("seq", live.getAttribute("data-seq") || "");
    var fresh = Date.now() - lastFull < refreshMs;
    url.searchParams.set("fresh", fresh ? "1" : "0");
    fetch(url.toString(), {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (r.status === 204) { return null; }
      if (r.status === 401) {
        status("Signed out: reload the page to sign in again.");
        throw new Error("signed out");
      }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      var seq = r.headers.get("X-Klique-Seq");
      return r.text().then(function (html) { return {html: html, seq: seq}; });
    }).then(function (got) {
      if (got) {
        live.innerHTML = got.html;
        if (got.seq) { live.setAttribute("data-seq", got.seq); }
        lastFull = Date.now();
        drawCharts(live);
        fillCsrf(live);
        updated();
      }
      setTimeout(tick, passMs);
    }).catch(function (e) {
      if (String(e.message) !== "signed out") {
        paused = true;
        status("Live updates paused (" + e.message + "); retrying.");
        setTimeout(tick, passMs * 5);
      }
    });
  }

  drawCharts(document);
  setTimeout(tick, passMs);
})();
