// Klique dashboard: follows a task's log (kliqued/web/logpage.py). Asks the raw log for the
// bytes after those shown, at the pass rate, while the task may still write; appends them
// as text (never as markup); stops once the task ended and nothing is left.
(function () {
  "use strict";
  var pre = document.querySelector("[data-log-tail]");
  if (!pre) { return; }
  var status = document.querySelector("[data-log-status]");
  var stateEl = document.querySelector("[data-task-state]");
  var passMs = Math.max(1000, parseInt(pre.getAttribute("data-pass-ms"), 10) || 1000);
  var next = pre.getAttribute("data-next") || "0";
  var epoch = pre.getAttribute("data-epoch") || "0";
  if (pre.getAttribute("data-done") === "1") { return; }

  function say(text) {
    if (status && status.textContent !== text) { status.textContent = text; }
  }
  function atBottom() {
    return window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
  }

  function tick() {
    var url = new URL(pre.getAttribute("data-src"), window.location.href);
    url.searchParams.set("offset", next);
    url.searchParams.set("epoch", epoch);
    fetch(url.toString(), {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (r.status === 401) { say("Signed out: reload the page to sign in again."); return null; }
      if (!r.ok) { throw new Error("HTTP " + r.status); }
      return r.text().then(function (text) {
        var follow = atBottom();
        var newEpoch = r.headers.get("X-Klique-Log-Epoch") || epoch;
        if (newEpoch !== epoch) {  // a new attempt: its log from its start
          pre.textContent = "";
          epoch = newEpoch;
        }
        if (text) { pre.appendChild(document.createTextNode(text)); }
        next = r.headers.get("X-Klique-Log-Next") || next;
        var state = r.headers.get("X-Klique-Task-State") || "";
        if (stateEl && state && stateEl.textContent !== state) { stateEl.textContent = state; }
        if (follow && text) { window.scrollTo(0, document.body.scrollHeight); }
        if (state === "ended" && !text) {
          say("The task ended: this is the whole log.");
          return null;
        }
        say("Live: new lines appear as the task writes them.");
        return true;
      });
    }).then(function (more) {
      if (more) { setTimeout(tick, passMs); }
    }).catch(function (e) {
      say("Live tail paused (" + e.message + "); retrying.");
      setTimeout(tick, passMs * 5);
    });
  }
  setTimeout(tick, passMs);
})();
