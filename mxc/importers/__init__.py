"""Other tools' job descriptions -> mxc specs (``mxc import``)."""
