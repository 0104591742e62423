package inbox

// Unexported helpers the external tests use.
var SplitStatements = splitStatements

// ArgEnd is one past the last valid Arg, so that the dialect tests can
// check every Arg a query binds is one the store knows.
const ArgEnd = argEnd
