// One-click copy of a whole id: a button with data-copy="<text>". The clipboard
// API needs a secure context (https, or localhost); elsewhere the text is put in
// a selection and copied with the older command, so it works over plain http too.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button[data-copy]");
  if (!button) return;
  event.preventDefault();
  // A second click while it says "copied" would take that for its label.
  if (button.hasAttribute("data-copied")) return;
  var text = button.getAttribute("data-copy");
  var done = function () {
    var label = button.textContent;
    button.textContent = "copied";
    button.setAttribute("data-copied", "true");
    setTimeout(function () {
      button.textContent = label;
      button.removeAttribute("data-copied");
    }, 1500);
  };
  var fallback = function () {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "absolute";
    area.style.left = "-9999px";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    if (ok) done();
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done, fallback);
  } else {
    fallback();
  }
});
