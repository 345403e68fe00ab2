"""``combee ui``: a small read-only web page over what Redis holds (namespaces, versions, prompts, diffs, recent
windows, the controller's decision). :mod:`combee.ui.render` is the HTML (pure), :mod:`combee.ui.server` the
aiohttp handlers; the data comes from :mod:`streams.overview`."""
