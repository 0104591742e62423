package inbox

// Unexported helpers the external tests use.
var (
	LoadMigrations  = loadMigrations
	RenameTable     = renameTable
	SplitStatements = splitStatements
)
